"""One upstream leg on the wire: POST it, watch its deadlines, tell its instance's circuit breaker how it
ended, and pass its answer to the client's sink (docs/proxy.md, "Waiting for the KV", "Usage").

A flow (``flows``) decides which legs run and when; this runs one. ``Exchange`` is a request's state
that its legs share: ids, targets, the kv deadline and prefill's usage details.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pd_runtime.proxy.answers import (
    IdRewriter,
    chunks_open_answer,
    merge_usage,
    merge_usage_events,
    opens_answer,
    stream_chunks,
    upstream_error_for_client,
    whole_from_stream,
)
from pd_runtime.proxy.circuits import Circuits
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.errors import (
    LegFailure,
    decode_without_output,
    kv_transfer_timeout,
    upstream_failed,
    upstream_timeout,
)
from pd_runtime.proxy.legs import (
    ClientRequest,
    Leg,
    Target,
    TransferIds,
)
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.sinks import Sink
from pd_runtime.proxy.tracing import Tracing
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool, UpstreamResponse

Source = Literal["request", "canary"]


@dataclass
class Exchange:
    """The state of one client request."""

    request: ClientRequest
    ids: TransferIds
    source: Source
    prefill: Target | None = None
    decode: Target | None = None
    started: float = field(default_factory=time.monotonic)
    rewriter: IdRewriter = field(init=False)
    kv_deadline: float | None = None
    """Loop time after which decode can no longer get the KV (prefill's answer + the kv wait)."""
    first_byte_timer: asyncio.Timeout | None = None
    """The streaming decode leg's deadline while it waits for its first byte."""
    prompt_details: dict[str, Any] | None = None
    """Prefill's usage.prompt_tokens_details, merged into decode's usage (docs/proxy.md, "Usage")."""

    def __post_init__(self) -> None:
        self.rewriter = IdRewriter(self.ids.request_id, self.ids.uid)

    def prefill_answered(self, kv_wait: float) -> None:
        """From prefill's answer on, decode's first byte is due within the kv wait (dropped transfers)."""
        self.kv_deadline = asyncio.get_running_loop().time() + kv_wait
        self.bound_first_byte()

    def bound_first_byte(self) -> None:
        timer, deadline = self.first_byte_timer, self.kv_deadline
        if timer is not None and deadline is not None and deadline < (timer.when() or math.inf):
            timer.reschedule(deadline)

    @contextlib.asynccontextmanager
    async def first_byte_bounded(self, timer: asyncio.Timeout, bounded: bool) -> AsyncIterator[None]:
        """While a streaming decode leg waits inside ``timer``, prefill's answer may bring its deadline
        forward; never once the leg is over (a decode that failed fast leaves a finished Timeout, which
        cannot be rescheduled: prefill's answer arriving just then was a 500)."""
        if bounded:
            self.first_byte_timer = timer
            self.bound_first_byte()
        try:
            yield
        finally:
            if self.first_byte_timer is timer:
                self.first_byte_timer = None


class Relay:
    """Runs the legs of every request: pooled connections (``upstream``), the optional leg spans
    (``tracing``), the circuit breakers (``circuits``)."""

    def __init__(
        self,
        config: ProxyConfig,
        upstream: UpstreamPool,
        circuits: Circuits,
        metrics: ProxyMetrics,
        tracing: Tracing | None,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.circuits = circuits
        self.metrics = metrics
        self.tracing = tracing

    async def to_client(self, exchange: Exchange, target: Target, leg: Leg, name: str, sink: Sink) -> None:
        """POST a decode (or colocated, or plain prefill) leg and pass its answer through, SSE chunk by chunk."""
        with self.circuits.verdict(target, exchange.prefill):
            if leg.assembled:
                await self._relay_whole(exchange, target, leg, sink)
            else:
                await self._relay_leg(exchange, target, leg, name, sink)

    async def _relay_whole(self, exchange: Exchange, target: Target, leg: Leg, sink: Sink) -> None:
        """A decode leg streamed for a client that did not ask for a stream (legs.streams_whole): its first
        byte is due within the kv wait, as a stream's; the whole answer within --response-timeout; the
        client gets the answer assembled from the stream (answers.whole_from_stream)."""
        timeouts = self.config.timeouts
        first_byte_due = asyncio.get_running_loop().time() + timeouts.response
        answered = False
        started = time.monotonic()
        try:
            async with (
                asyncio.timeout(timeouts.response) as deadline,
                exchange.first_byte_bounded(deadline, True),
                self.open_leg(target, leg, "decode") as resp,
            ):
                if resp.status != 200:
                    body = await resp.read()
                    raise LegFailure(
                        "decode", "http", upstream_error_for_client(resp.status, body, "decode", exchange.rewriter)
                    )
                parts = []
                while data := await resp.read_some():
                    if not answered:
                        answered = True
                        exchange.first_byte_timer = None
                        deadline.reschedule(first_byte_due)  # from here the whole answer's deadline
                    parts.append(data)
                events = exchange.rewriter.whole(b"".join(parts))
        except TimeoutError as exc:
            raise self._timed_out(exchange, "decode", answered, True, timeouts.response, first_byte_due) from exc
        except UpstreamError as exc:
            raise _connection_failed("decode", answered) from exc
        finally:
            self.metrics.leg_seconds.labels("decode").observe(time.monotonic() - started)
        document = events  # an engine that answered whole after all
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            chunks = stream_chunks(events)  # parsed once: whether it opens an answer, then the answer
            if not chunks_open_answer(chunks, exchange.request):
                raise LegFailure("decode", "no_output", decode_without_output())
            if any(isinstance(c, dict) and "error" in c for c in chunks):
                # not streamed, vLLM answers a request that failed after its first token with a 500
                raise LegFailure("decode", "http", upstream_failed("decode engine failed the request", "decode_failed"))
            document = json.dumps(whole_from_stream(chunks, exchange.request), separators=(",", ":")).encode()
        if exchange.prompt_details is not None:
            document = merge_usage(document, exchange.prompt_details)
        await sink.whole(200, "application/json", document)

    def _timed_out(
        self, exchange: Exchange, name: str, answered: bool, bounded: bool, first_deadline: float, first_byte_due: float
    ) -> LegFailure:
        """What a leg's timeout means: the kv wait passed, a write-mode prefill that never answered, or the
        engine's own first-byte or idle timeout."""
        timeouts = self.config.timeouts
        if not answered and bounded and _kv_bound(exchange, first_byte_due):
            return LegFailure(name, "kv_timeout", kv_transfer_timeout(timeouts.kv_wait))
        if not answered and name == "decode" and exchange.prefill is not None and exchange.kv_deadline is None:
            # write mode: decode's first byte waits for prefill's KV, and prefill has not answered yet
            what = f"decode had no first byte within {first_deadline:g} s, prefill had not answered"
            return LegFailure("prefill", "timeout", upstream_timeout(f"prefill engine timed out: {what}"))
        what = f"no chunk for {timeouts.idle:g} s" if answered else f"no first byte within {first_deadline:g} s"
        return LegFailure(name, "timeout", upstream_timeout(f"{name} engine timed out: {what}"))

    async def _relay_leg(self, exchange: Exchange, target: Target, leg: Leg, name: str, sink: Sink) -> None:
        timeouts = self.config.timeouts
        loop = asyncio.get_running_loop()
        first_deadline = timeouts.first_byte if exchange.request.stream else timeouts.response
        first_byte_due = loop.time() + first_deadline
        answered = False  # the engine's first body bytes came (for decode: its KV came, or loading it failed)
        streaming = False  # the client's stream has begun
        started = time.monotonic()
        bounded = exchange.request.stream and name == "decode"
        try:
            async with (
                asyncio.timeout(first_deadline) as deadline,
                exchange.first_byte_bounded(deadline, bounded),
                self.open_leg(target, leg, name) as resp,
            ):
                if resp.status != 200:
                    body = await resp.read()
                    raise LegFailure(
                        name, "http", upstream_error_for_client(resp.status, body, name, exchange.rewriter)
                    )
                content_type = resp.headers.get("content-type", "application/json")
                if not content_type.startswith("text/event-stream"):
                    body = await resp.read()
                    self.circuits.answered(target)
                    body = exchange.rewriter.whole(body)
                    if name == "decode" and exchange.prompt_details is not None:
                        body = merge_usage(body, exchange.prompt_details)
                    await sink.whole(200, content_type, body)
                    return
                relay = _ChunkRelay(exchange, sink, deadline, self.metrics, name == "decode", timeouts.idle)
                # A decode stream's first events are held until one begins the answer (answers.opens_answer):
                # a stream vLLM ended without a token or its error is then the client's 502, not an empty 200.
                held = b"" if name == "decode" else None
                while not streaming and (data := await resp.read_some()):
                    out = relay.rewrite(data)
                    now = loop.time()
                    relay.due = deadline.when() or 0.0  # the kv wait may have moved it
                    if out:
                        answered = True
                        exchange.first_byte_timer = None
                        if held is not None:
                            out, held = held + out, b""
                            if not opens_answer(out, exchange.request):
                                out, held = b"", out
                    if out:
                        streaming = True
                        self.circuits.answered(target)
                        exchange.first_byte_timer = None
                        await sink.begin_stream(content_type)
                        self.metrics.ttft.observe(time.monotonic() - exchange.started)
                        relay.last = now
                        await sink.write(out)
                    relay.idle_from(now)
                if streaming:  # every further chunk is relayed from the engine connection's callback
                    while not await resp.forward(relay.deliver):
                        relay.raise_failure()
                        await sink.drain()
                    relay.raise_failure()
                tail = relay.rewrite(exchange.rewriter.flush(), feed=False)
                if not streaming:
                    if held is not None and not opens_answer(held + tail, exchange.request):
                        raise LegFailure(name, "no_output", decode_without_output())
                    await sink.begin_stream(content_type)
                    tail = (held or b"") + tail
                if tail:
                    await sink.write(tail)
                await sink.end_stream()
        except TimeoutError as exc:
            raise self._timed_out(exchange, name, answered, bounded, first_deadline, first_byte_due) from exc
        except UpstreamError as exc:
            raise _connection_failed(name, answered) from exc
        finally:
            self.metrics.leg_seconds.labels(name).observe(time.monotonic() - started)

    def open_leg(self, target: Target, leg: Leg, name: str) -> contextlib.AbstractAsyncContextManager[UpstreamResponse]:
        instance, known = target.instance, self.circuits.instance(target)
        host = known.http_host if known is not None else instance.http_host or instance.host
        if self.tracing is None:
            return self.upstream.post(host, instance.http_port, leg.path, leg.headers, leg.encoded())
        return self.tracing.leg(
            name,
            instance.http_address,
            leg.headers,
            lambda headers: self.upstream.post(host, instance.http_port, leg.path, headers, leg.encoded()),
        )


class _ChunkRelay:
    """A streamed leg's chunks on their way to the client: the id rewrite, prefill's usage details merged
    into decode's usage, the ITL histogram, the idle deadline moved on. After the first chunk ``deliver``
    runs in the engine connection's own callback (``UpstreamResponse.forward``): a chunk costs one read,
    one rewrite, one write and no task switch. It never raises there; the leg's task raises what failed."""

    def __init__(
        self,
        exchange: Exchange,
        sink: Sink,
        deadline: asyncio.Timeout,
        metrics: ProxyMetrics,
        decode: bool,
        idle: float,
    ) -> None:
        self._exchange = exchange
        self._rewriter = exchange.rewriter
        self._send = sink.send
        self._deadline = deadline
        self._itl = metrics.itl
        self._usage = decode and _streams_usage(exchange.request)
        self._idle = idle
        self._slack = min(1.0, idle / 10)  # the idle deadline moves only when it is this far off
        self._loop = asyncio.get_running_loop()
        self.last = self.due = 0.0
        self.failure: Exception | None = None

    def rewrite(self, data: bytes, feed: bool = True) -> bytes:
        out = self._rewriter.feed(data) if feed else data
        if self._usage and out and (details := self._exchange.prompt_details) is not None:
            out = merge_usage_events(out, details)
        return out

    def idle_from(self, now: float) -> None:
        if abs(now + self._idle - self.due) > self._slack:
            self.due = now + self._idle
            self._deadline.reschedule(self.due)

    def deliver(self, data: bytes) -> bool:
        """One read of the engine's body: False stops the forwarding (client's socket full, or a failure)."""
        try:
            out = self.rewrite(data)
            now = self._loop.time()
            more = True
            if out:
                self._itl.observe(now - self.last)
                self.last = now
                more = self._send(out)
            self.idle_from(now)
            return more
        except Exception as exc:  # ClientGone, or a failure the leg's task must see
            self.failure = exc
            return False

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure


def _connection_failed(name: str, answered: bool) -> LegFailure:
    kind = "broken" if answered else "unreachable"
    return LegFailure(name, kind, upstream_failed(f"{name} engine failed: connection {kind}", f"{name}_failed"))


def _streams_usage(request: ClientRequest) -> bool:
    """Whether the client asked for usage in its stream (stream_options.include_usage or continuous stats)."""
    options = request.body.get("stream_options") or {}
    return bool(options.get("include_usage") or options.get("continuous_usage_stats"))


def _kv_bound(exchange: Exchange, first_byte_due: float) -> bool:
    """Whether the kv wait, not the first-byte timeout, ended the wait for decode's first byte."""
    return exchange.kv_deadline is not None and exchange.kv_deadline < first_byte_due
