"""An open-loop load generator for the e2e tests: evenly spaced streamed completions at a rate the test
sets and changes, spread over a Service's ready endpoints, each judged against an SLO by the client.

The endpoints come from a callable read every ``refresh_s`` (kube.ReadyEndpoints: the Service's
ready EndpointSlice addresses, followed with a watch as kube-proxy follows them); requests go round
robin over them. Sending, timing and judging are the goodput bench's
own (`pd_runtime.bench`: one pooled aiohttp client per endpoint, TTFT and ITL stamped as chunks arrive,
the SLO applied as `pdctl bench` applies it), so the attainment the test asserts is the bench's.
Arrivals are evenly spaced rather than Poisson: the test sets a rate and asserts what the operator does
at it, and evenly spaced arrivals give the proxies' demand window the same count at every sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pd_runtime.bench.client import BenchClient, ClientConfig
from pd_runtime.bench.plan import PlannedRequest
from pd_runtime.bench.slo import RequestTiming, Slo, judge
from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.payload import encode_body, request_body

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """One request as the client saw it: when it was sent (seconds since the load started) and its verdict."""

    at: float
    endpoint: str
    good: bool
    error: str | None
    ttft_ms: float | None
    itl_ms: float | None


@dataclass
class OpenLoop:
    """Streamed completions at ``rate`` requests per second (0: none), until ``stop``."""

    endpoints: Callable[[], list[str]]  # the ready endpoint addresses, called from a worker thread
    model: str
    slo: Slo
    prompt_tokens: int
    output_tokens: int
    port: int = 8000
    refresh_s: float = 0.2
    timeout_s: float = 120.0
    rate: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready: list[str] = field(default_factory=list)
    _failure: BaseException | None = None

    def now(self) -> float:
        """Seconds since the load started: the clock of ``sent`` (and of a test's own timeline)."""
        return time.monotonic() - self.started

    def __enter__(self) -> OpenLoop:
        self._ready = self.endpoints()
        self._thread = threading.Thread(target=self._run, name="open-loop", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 30)
        assert self._failure is None, f"the load generator failed: {self._failure!r}"

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:
            self._failure = err

    async def _main(self) -> None:
        clients: dict[str, BenchClient] = {}
        opened = contextlib.AsyncExitStack()
        tasks: set[asyncio.Task[list[RequestTiming]]] = set()
        refresher = asyncio.create_task(self._refresh())
        rng = random.Random(0)
        turn, due = 0, time.monotonic()
        try:
            while not self._stop.is_set():
                rate = self.rate
                if rate <= 0 or not self._ready:
                    await asyncio.sleep(0.05)
                    due = time.monotonic()
                    continue
                due += 1 / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                endpoint = self._ready[turn % len(self._ready)]
                turn += 1
                client = clients.get(endpoint)
                if client is None:
                    url = f"http://{endpoint}:{self.port}/v1/completions"
                    config = ClientConfig(url, Endpoint.COMPLETIONS, self.timeout_s)
                    client = clients[endpoint] = await opened.enter_async_context(BenchClient(config))
                body = request_body(Endpoint.COMPLETIONS, self.model, self.prompt_tokens, self.output_tokens, rng)
                request = PlannedRequest(turn, f"ramp-{turn}", False, 0.0, encode_body(body))
                task = asyncio.create_task(client.run_stage([request], self._judged(self.now(), endpoint)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            refresher.cancel()
            await opened.aclose()

    def _judged(self, at: float, endpoint: str) -> Callable[[RequestTiming], None]:
        def record(timing: RequestTiming) -> None:
            outcome = judge(timing, self.slo, self.output_tokens)
            if outcome.error is not None:
                log.warning("request to %s sent at %.1f s failed: %s", endpoint, at, outcome.error)
            self.sent.append(Sent(at, endpoint, outcome.good, outcome.error, outcome.ttft_ms, outcome.itl_ms))

        return record

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                self._ready = await asyncio.to_thread(self.endpoints)
            except Exception as err:
                log.warning("reading the ready endpoints failed (%s); keeping %s", err, self._ready)
