"""Canary: a greedy request through P->D at start and at an interval, checked and reported in /status.

Readiness can then mean "a KV transfer really succeeded", not only "processes answer" (llm-d users
report silent decode-only operation), and "succeeded" means the right KV arrived: the same request is
sent to the prefill engine that served the transfer as a plain request, and decode's token ids must
equal the ones prefill computes whole (kvcheck.py). vLLM users report HTTP 200 with wrong output after
KV failures (vLLM #52234, #52276). An answer from prefill alone does not count as success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from pd_runtime.protocol import new_request_uid
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.flows import ProxyCore, Result
from pd_runtime.proxy.kvcheck import KvMismatch, Unusable, canary_body, compare, stops_serving, token_ids
from pd_runtime.proxy.legs import ClientRequest, Target, plain_leg
from pd_runtime.proxy.sinks import BufferSink
from pd_runtime.proxy.status import CanaryState

log = logging.getLogger(__name__)

ROUTABLE_POLL_S = 1.0


class Canary:
    def __init__(self, core: ProxyCore, config: ProxyConfig) -> None:
        self.core = core
        self.config = config
        self._state = CanaryState(enabled=config.canary_interval_s > 0)
        self.mismatch: KvMismatch | None = None
        """The first KV mismatch since start; kept for the life of the process (intermittent corruption is
        still corruption: only a new proxy, i.e. a new pod, clears it)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> CanaryState:
        return replace(self._state, serving_stopped=self.stops_serving)

    @property
    def stops_serving(self) -> bool:
        return stops_serving(self.config.on_kv_mismatch, self.mismatch)

    def start(self) -> None:
        if self._state.enabled:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _routable(self) -> frozenset[str]:
        return frozenset(inst.key for inst in self.core.registry.live(None, time.monotonic()))

    async def _loop(self) -> None:
        """At start, every interval, and as soon as the routable instances change: an engine joined (the
        first ones after start, a new one, one back after failed probes or an eviction, e.g. restarted)
        or left; its KV path is unverified until the canary has been through it."""
        loop = asyncio.get_running_loop()
        while True:
            routable = self._routable()
            await self.run_once()
            due = loop.time() + self.config.canary_interval_s
            while (left := due - loop.time()) > 0 and self._routable() == routable:
                await asyncio.sleep(min(left, ROUTABLE_POLL_S))

    async def run_once(self) -> CanaryState:
        error, kv_match = await self._probe()
        self._state = CanaryState(
            enabled=self._state.enabled,
            ok=error is None,
            at=datetime.now(UTC),
            error=error,
            kv_match=kv_match,
            kv_mismatch=None if self.mismatch is None else self.mismatch.to_json(),
        )
        self.core.metrics.canary_ok.set(1 if error is None else 0)
        if self.config.mode == "disaggregated":
            result = "unverified" if kv_match is None else "match" if kv_match else "mismatch"
            self.core.metrics.kv_canary.labels(result).inc()
        if error is not None:
            log.warning("canary failed: %s", error)
        return self.state

    async def _probe(self) -> tuple[str | None, bool | None]:
        """(error, kv_match): no error when one request went through and, disaggregated, both legs of its
        transfer succeeded and its tokens equal prefill's own; kv_match None when not compared."""
        model = self.config.canary_model or await self._first_model()
        if model is None:
            return "no live decode engine lists a model", None
        body = canary_body(model, self.config.canary_prompt)
        sink = BufferSink()
        result = await self.core.handle(ClientRequest("completions", body), sink, source="canary")
        if sink.status != 200:
            return f"HTTP {sink.status}: {sink.body[:200].decode(errors='replace')}", None
        if self.config.mode != "disaggregated":
            return None, None
        if not result.verified_transfer:
            return "the request was served without a verified P->D KV transfer", None
        return await self._check_kv(result, sink.body, body)

    async def _check_kv(self, result: Result, answer: bytes, body: dict[str, Any]) -> tuple[str | None, bool | None]:
        """Send the same request to the transfer's prefill engine as a plain request and compare the ids."""
        exchange = result.exchange
        assert exchange is not None and exchange.prefill is not None and exchange.decode is not None
        try:
            got = token_ids(json.loads(answer), "the P->D")
            expected = token_ids(await self._reference(exchange.prefill, body), "prefill's plain")
        except (Unusable, ValueError) as exc:
            return f"KV not checked: {exc}", None
        comparison = compare(expected, got)
        if comparison.match:
            return None, True
        mismatch = KvMismatch(
            at=datetime.now(UTC),
            transfer_id=exchange.ids.transfer_id,
            prefill=exchange.prefill.instance.http_address,
            decode=exchange.decode.instance.http_address,
            comparison=comparison,
        )
        if self.mismatch is None:
            self.mismatch = mismatch
        log.error(
            "canary: KV mismatch, %s%s",
            mismatch.describe(),
            "; the proxy stops serving (on-kv-mismatch stopServing)" if self.stops_serving else "",
            extra={"transfer_id": mismatch.transfer_id},
        )
        return f"KV mismatch: {mismatch.describe()}", False

    async def _reference(self, prefill: Target, body: dict[str, Any]) -> Any:
        """The prefill engine's own answer (no kv_transfer_params: a plain request it computes whole). Never
        decode's: vLLM < 0.32 (write) / 0.33 (read) treats every decode request as a remote prefill."""
        assert self.core.session is not None
        leg = plain_leg(ClientRequest("completions", body), prefill, new_request_uid(), self.config.engine_api_key)
        url = prefill.instance.base_url + leg.path
        try:
            async with asyncio.timeout(self.config.timeouts.response):
                async with self.core.session.post(url, data=leg.encoded(), headers=leg.headers) as resp:
                    status, raw = resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Unusable(f"prefill's plain request failed: {type(exc).__name__} {exc}") from None
        if status != 200:
            raise Unusable(f"prefill's plain request answered HTTP {status}: {raw[:200].decode(errors='replace')}")
        return json.loads(raw)

    async def _first_model(self) -> str | None:
        now = time.monotonic()
        live = (
            self.core.registry.live("D", now)
            if self.config.mode == "disaggregated"
            else self.core.registry.live(None, now)
        )
        if not live or self.core.session is None:
            return None
        headers = {"Authorization": f"Bearer {self.config.engine_api_key}"} if self.config.engine_api_key else {}
        try:
            async with asyncio.timeout(self.config.timeouts.health):
                async with self.core.session.get(f"{live[0].base_url}/v1/models", headers=headers) as resp:
                    document = json.loads(await resp.read())
            model = document["data"][0]["id"]
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
            return None
        return model if isinstance(model, str) else None
