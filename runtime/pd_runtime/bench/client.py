"""The shell that talks HTTP: one pooled aiohttp session, open-loop sends, timestamps per chunk.

Why aiohttp: it reads a stream with about half the per-chunk CPU of httpx (measured side by side in
benchmarks/bench_client_accuracy.py, docs/benchmarks.md). Where the clock is read:
- a request starts when aiohttp hands its body to the socket (its request-chunk-sent trace signal),
  not when the coroutine starts building it, so the client's own request-building time (~0.3 ms of
  Python per request, more when the loop is busy) is not charged to the server; the delay from the
  planned arrival to that moment is reported as send lag;
- a chunk arrives the moment a read returns, before any parsing, so parsing never lands in TTFT/ITL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any

import aiohttp

from pd_runtime.bench.plan import PlannedRequest
from pd_runtime.bench.slo import RequestTiming
from pd_runtime.openai_api import DONE, Endpoint, SseDecoder, interpret

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Bench-Request-Id"
"""Sent with every request so a server (or its logs) can be matched with the bench's records."""

clock = time.perf_counter


@dataclass
class _StreamState:
    """Mutable facts gathered while one stream is read."""

    on_wire: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    token_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False
    error: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    url: str
    endpoint: Endpoint
    timeout_s: float
    api_key: str | None = None


class BenchClient:
    """One connection pool for the whole run (no per-request session, no connection cap)."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._headers = {"Content-Type": "application/json"}
        if config.api_key:
            self._headers["Authorization"] = f"Bearer {config.api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BenchClient:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(_mark_on_wire)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            trace_configs=[trace],
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def run_stage(
        self, plan: Sequence[PlannedRequest], on_finished: Callable[[RequestTiming], None]
    ) -> list[RequestTiming]:
        """Send every planned request at its offset, never waiting for earlier responses."""
        start = clock()
        tasks: list[asyncio.Task[RequestTiming]] = []
        for request in plan:
            # When behind schedule, still yield once so the request just created gets on the wire
            # before the next one is built.
            await asyncio.sleep(max(0.0, start + request.offset_s - clock()))
            task = asyncio.create_task(self._send(request, start))
            task.add_done_callback(lambda done: _report(done, on_finished))
            tasks.append(task)
        return list(await asyncio.gather(*tasks))

    async def _send(self, request: PlannedRequest, stage_start: float) -> RequestTiming:
        state = _StreamState()
        issued = clock()
        try:
            async with asyncio.timeout(self._config.timeout_s):
                await self._stream(request, state)
        except TimeoutError:
            state.error = f"timeout: no complete reply within {self._config.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            state.error = f"connection: {type(exc).__name__}: {exc}"[:300]
        except ValueError as exc:  # JSON or UTF-8 that does not decode
            state.error = f"stream: undecodable chunk: {exc}"[:300]
        end = clock()
        if state.error is None and not state.done:
            state.error = "stream: ended before [DONE]"
        if state.error is not None:
            log.debug("request %s failed: %s", request.request_id, state.error)
        return _timing(request, state, stage_start, state.on_wire or issued, end)

    async def _stream(self, request: PlannedRequest, state: _StreamState) -> None:
        assert self._session is not None, "BenchClient used outside 'async with'"
        headers = {**self._headers, REQUEST_ID_HEADER: request.request_id}
        async with self._session.post(
            self._config.url, data=request.body, headers=headers, trace_request_ctx=state
        ) as response:
            if response.status != 200:
                state.error = await _http_error(response)
                return
            decoder = SseDecoder()
            async for chunk in response.content.iter_any():
                arrived = clock()
                for payload in decoder.feed(chunk):
                    self._absorb(payload, arrived, state)
                if state.done or state.error is not None:
                    return

    def _absorb(self, payload: str, arrived: float, state: _StreamState) -> None:
        if payload.strip() == DONE:
            state.done = True
            return
        info = interpret(json.loads(payload), self._config.endpoint)
        if info.error is not None:
            state.error = info.error
            return
        if info.carries_token:
            state.first_token = arrived if state.first_token is None else state.first_token
            state.last_token = arrived
            state.token_chunks += 1
        if info.completion_tokens is not None:
            state.completion_tokens = info.completion_tokens
        if info.prompt_tokens is not None:
            state.prompt_tokens = info.prompt_tokens


async def _mark_on_wire(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestChunkSentParams
) -> None:
    """Runs just before a body chunk is written; the last one marks the request as fully sent."""
    state = context.trace_request_ctx
    if isinstance(state, _StreamState):
        state.on_wire = clock()


def _report(done: asyncio.Task[RequestTiming], on_finished: Callable[[RequestTiming], None]) -> None:
    if not done.cancelled() and done.exception() is None:
        on_finished(done.result())


def _timing(request: PlannedRequest, state: _StreamState, stage_start: float, sent: float, end: float) -> RequestTiming:
    def offset(t: float | None) -> float | None:
        return None if t is None else t - stage_start

    return RequestTiming(
        index=request.index,
        request_id=request.request_id,
        warmup=request.warmup,
        scheduled_s=request.offset_s,
        sent_s=sent - stage_start,
        end_s=end - stage_start,
        first_token_s=offset(state.first_token),
        last_token_s=offset(state.last_token),
        # Without usage (a server ignoring include_usage) fall back to counting token chunks.
        completion_tokens=state.completion_tokens if state.completion_tokens is not None else state.token_chunks,
        prompt_tokens=state.prompt_tokens,
        error=state.error,
    )


async def _http_error(response: aiohttp.ClientResponse) -> str:
    """``http_<status>: <message>`` with the OpenAI error message when the body has one."""
    raw = await response.content.read(4096)
    text = raw.decode(errors="replace")
    try:
        body: Any = json.loads(text)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("message", text)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = text
    return f"http_{response.status}: {str(message).strip()}"[:300]
