"""A leg's answer on its way to the client: POST the leg, watch its deadlines, tell its instance's circuit
breaker how it ended (``circuits``), and pass the answer to the client's sink, chunk by chunk or
assembled whole (docs/proxy.md, "Waiting for the KV").

What the client gets is the engine's answer reshaped by the pure functions after ``_ChunkRelay``: the
internal request id replaced by the client's, an engine's error passed on or named, prefill's usage
details merged (docs/proxy.md, "Usage"), a decode stream that ends before any output told apart
(docs/proxy.md, "Errors"). A flow (``flows``) decides which legs run and when; ``Exchange`` is a
request's state that its legs share: ids, targets, the kv deadline and prefill's usage details.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from pd_runtime.openai_api import DONE, Endpoint, SseDecoder, interpret
from pd_runtime.proxy import jsoncodec
from pd_runtime.proxy.circuits import Circuits
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.errors import (
    ApiError,
    LegFailure,
    deadline_exceeded,
    decode_without_output,
    engine_failed,
    kv_transfer_timeout,
)
from pd_runtime.proxy.legs import ClientRequest, Leg, Target, TransferIds
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.sinks import Sink
from pd_runtime.proxy.timer import Timer
from pd_runtime.proxy.tracing import Tracing
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool, UpstreamResponse

Source = Literal["request", "canary"]


class Exchange:
    """The state of one client request (a plain class with slots, not a dataclass: see ``legs.ClientRequest``)."""

    __slots__ = (
        "deadline",
        "decode",
        "first_byte_timer",
        "ids",
        "kv_deadline",
        "loop",
        "prefill",
        "prompt_details",
        "request",
        "rewriter",
        "source",
        "started",
        "stream_filter",
    )

    def __init__(
        self,
        request: ClientRequest,
        ids: TransferIds,
        source: Source,
        prefill: Target | None = None,
        decode: Target | None = None,
        *,
        deadline: Deadline,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.request = request
        self.loop = loop
        """The loop the request is served on (``timer.RunningLoop``)."""
        self.ids = ids
        self.source: Source = source
        self.prefill = prefill
        self.decode = decode
        self.started = time.monotonic()
        self.rewriter = IdRewriter(ids.request_id, ids.uid)
        self.kv_deadline: float | None = None
        """Loop time after which decode can no longer get the KV (prefill's answer + the kv wait)."""
        self.first_byte_timer: Timer | None = None
        """The streaming decode leg's deadline while it waits for its first byte."""
        self.prompt_details: dict[str, Any] | None = None
        """Prefill's usage.prompt_tokens_details, merged into decode's usage (docs/proxy.md, "Usage")."""
        self.deadline = deadline
        """The request's one deadline, shared by a failover's exchanges (``deadline``)."""
        self.stream_filter: Callable[[bytes], bytes] | None = None
        """Sees a streamed answer's whole events on their way to the client and may change them: a migrating
        request's (``migration``)."""

    def prefill_answered(self, kv_wait: float) -> None:
        """From prefill's answer on, decode's first byte is due within the kv wait (dropped transfers)."""
        self.kv_deadline = self.loop.time() + kv_wait
        self.bound_first_byte()

    def bound_first_byte(self) -> None:
        timer, deadline = self.first_byte_timer, self.kv_deadline
        if timer is not None and deadline is not None and deadline < (timer.when() or math.inf):
            timer.reschedule(deadline)

    def first_byte_bounded(self, timer: Timer, bounded: bool) -> FirstByteBound:
        """While a streaming decode leg waits inside ``timer``, prefill's answer may bring its deadline
        forward; never once the leg is over (a decode that failed fast leaves a finished Timer, which
        cannot be rescheduled: prefill's answer arriving just then was a 500)."""
        return FirstByteBound(self, timer, bounded)


class FirstByteBound:
    """``Exchange.first_byte_bounded``: a class rather than an async generator, which costs more per leg
    and which mypyc does not compile (docs/benchmarks.md)."""

    __slots__ = ("_bounded", "_exchange", "_timer")

    def __init__(self, exchange: Exchange, timer: Timer, bounded: bool) -> None:
        self._exchange = exchange
        self._timer = timer
        self._bounded = bounded

    async def __aenter__(self) -> None:
        if self._bounded:
            self._exchange.first_byte_timer = self._timer
            self._exchange.bound_first_byte()

    async def __aexit__(self, *exc: object) -> None:
        if self._exchange.first_byte_timer is self._timer:
            self._exchange.first_byte_timer = None


class Relay:
    """Opens every leg (pooled connections of ``upstream``, the optional leg spans of ``tracing``) and
    carries the answers the client gets, telling each leg's instance how it ended (``circuits``)."""

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
        byte is due as a stream's (the first-byte bound and the kv wait); the whole answer by the request's
        deadline; the client gets the answer assembled from the stream (``whole_from_stream``)."""
        first_byte_due = exchange.loop.time() + self.config.timeouts.first_byte
        answered = False
        started = time.monotonic()
        try:
            async with (
                Timer(exchange.deadline.bound(first_byte_due), exchange.loop) as timer,
                exchange.first_byte_bounded(timer, True),
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
                        timer.reschedule(exchange.deadline.at)  # from here only the request's deadline
                    parts.append(data)
                events = exchange.rewriter.whole(b"".join(parts))
        except TimeoutError as exc:
            raise self._timed_out(exchange, "decode", answered, True, timer.when(), first_byte_due) from exc
        except UpstreamError as exc:
            raise _connection_failed("decode", answered) from exc
        finally:
            self.metrics.leg_seconds.labels("decode").observe(time.monotonic() - started)
        document = events  # an engine that answered whole after all
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            chunks = stream_chunks(events)  # parsed once: whether it opens an answer, then the answer
            if self._fails_before_output(exchange, answer_opening(chunks, exchange.request)):
                raise self._without_output(exchange, "decode")
            if any(isinstance(c, dict) and "error" in c for c in chunks):
                # not streamed, vLLM answers a request that failed after its first token with a 500
                raise LegFailure("decode", "http", engine_failed("decode", "decode engine failed the request"))
            document = json.dumps(whole_from_stream(chunks, exchange.request), separators=(",", ":")).encode()
        if exchange.prompt_details is not None:
            document = merge_usage(document, exchange.prompt_details)
        await sink.whole(200, "application/json", document)

    @staticmethod
    def _fails_before_output(exchange: Exchange, opening: Literal["answer", "error"] | None) -> bool:
        """Nothing opens the answer; or, after prefill answered with KV, vLLM's error event opens it: from
        0.32 a request that failed its KV load (``write_failed``, a failed read) ends so instead of with an
        empty stream."""
        return opening is None or (opening == "error" and exchange.kv_deadline is not None)

    def _without_output(self, exchange: Exchange, name: str) -> LegFailure:
        """A decode stream that ended before its answer began; after prefill answered with KV (the kv
        deadline is set) that is decode failing a request whose KV never loaded, counted on its own."""
        if exchange.kv_deadline is not None:
            self.metrics.kv_load_failures.inc()
        return LegFailure(name, "no_output", decode_without_output())

    def _timed_out(
        self, exchange: Exchange, name: str, answered: bool, bounded: bool, when: float | None, first_byte_due: float
    ) -> LegFailure:
        """What a leg's timer (set for ``when``) ending it means: the request's deadline passed, the kv wait
        passed, a write-mode prefill never answered, or the engine gave no first byte or chunk in time."""
        timeouts = self.config.timeouts
        if when is not None and exchange.deadline.ended(when):
            phase = f"while {name} streamed" if answered else f"before {name}'s first byte"
            return LegFailure(name, "deadline", deadline_exceeded(exchange.deadline.describe(phase)))
        if not answered and bounded and _kv_bound(exchange, first_byte_due):
            return LegFailure(name, "kv_timeout", kv_transfer_timeout(timeouts.kv_wait))
        first = f"no first byte within {timeouts.first_byte:g} s (--first-byte-timeout)"
        if not answered and name == "decode" and exchange.prefill is not None and exchange.kv_deadline is None:
            # write mode: decode's first byte waits for prefill's KV, and prefill has not answered yet
            return LegFailure(
                "prefill", "timeout", engine_failed("prefill", f"prefill engine hung: decode had {first} before it")
            )
        what = f"no chunk for {timeouts.idle:g} s (--idle-timeout)" if answered else first
        return LegFailure(name, "timeout", engine_failed(name, f"{name} engine hung: {what}"))

    async def _relay_leg(self, exchange: Exchange, target: Target, leg: Leg, name: str, sink: Sink) -> None:
        """A leg relayed as it comes: its first byte due within --first-byte-timeout when it streams (a leg
        answered whole has nothing to show before it is done: the request's deadline alone bounds it), then
        every chunk within --idle-timeout of the last, all by the request's deadline."""
        timeouts = self.config.timeouts
        first_byte_due = exchange.loop.time() + timeouts.first_byte if exchange.request.stream else math.inf
        answered = False  # the engine's first body bytes came (for decode: its KV came, or loading it failed)
        streaming = False  # the client's stream has begun
        started = time.monotonic()
        bounded = exchange.request.stream and name == "decode"
        try:
            async with (
                Timer(exchange.deadline.bound(first_byte_due), exchange.loop) as timer,
                exchange.first_byte_bounded(timer, bounded),
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
                    self.circuits.answered_by(target)
                    body = exchange.rewriter.whole(body)
                    if name == "decode" and exchange.prompt_details is not None:
                        body = merge_usage(body, exchange.prompt_details)
                    await sink.whole(200, content_type, body)
                    return
                relay = _ChunkRelay(exchange, sink, timer, self.metrics, name == "decode", timeouts.idle)
                # A decode stream's first events are held until one begins the answer (``opens_answer``):
                # a stream vLLM ended without a token or its error is then the client's 502, not an empty 200.
                held = b"" if name == "decode" else None
                while not streaming and (data := await resp.read_some()):
                    out = relay.rewrite(data)
                    now = exchange.loop.time()
                    relay.due = timer.when() or 0.0  # the kv wait may have moved it
                    if out:
                        answered = True
                        exchange.first_byte_timer = None
                        if held is not None:
                            out, held = held + out, b""
                            opening = answer_opening(stream_chunks(out), exchange.request)
                            if opening is None:
                                out, held = b"", out
                            elif self._fails_before_output(exchange, opening):
                                raise self._without_output(exchange, name)
                    if out:
                        streaming = True
                        self.circuits.answered_by(target)
                        exchange.first_byte_timer = None
                        if not sink.started:  # a migrated request's continuation is not a first token
                            self.metrics.ttft.observe(time.monotonic() - exchange.started)
                        await sink.begin_stream(content_type)
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
                        raise self._without_output(exchange, name)
                    await sink.begin_stream(content_type)
                    tail = (held or b"") + tail
                if tail:
                    await sink.write(tail)
                await sink.end_stream()
        except TimeoutError as exc:
            raise self._timed_out(exchange, name, answered, bounded, timer.when(), first_byte_due) from exc
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
        deadline: Timer,
        metrics: ProxyMetrics,
        decode: bool,
        idle: float,
    ) -> None:
        self._exchange = exchange
        self._rewriter = exchange.rewriter
        self._filter = exchange.stream_filter
        self._send = sink.send
        self._deadline = deadline
        self._itl = metrics.itl
        self._usage = decode and _streams_usage(exchange.request)
        self._idle = idle
        self._end = exchange.deadline.at  # no chunk is waited for past the request's deadline
        self._slack = min(1.0, idle / 10)  # the idle deadline moves only when it is this far off
        self._loop = exchange.loop
        self.last = self.due = 0.0
        self.failure: Exception | None = None

    def rewrite(self, data: bytes, feed: bool = True) -> bytes:
        out = self._rewriter.feed(data) if feed else data
        if self._filter is not None and out:
            out = self._filter(out)
        if self._usage and out and (details := self._exchange.prompt_details) is not None:
            out = merge_usage_events(out, details)
        return out

    def idle_from(self, now: float) -> None:
        due = min(now + self._idle, self._end)
        if abs(due - self.due) > self._slack:
            self.due = due
            self._deadline.reschedule(due)

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
    return LegFailure(name, kind, engine_failed(name, f"{name} engine failed: connection {kind}"))


def _streams_usage(request: ClientRequest) -> bool:
    """Whether the client asked for usage in its stream (stream_options.include_usage or continuous stats)."""
    options = request.body.get("stream_options") or {}
    return bool(options.get("include_usage") or options.get("continuous_usage_stats"))


def _kv_bound(exchange: Exchange, first_byte_due: float) -> bool:
    """Whether the kv wait, not the first-byte timeout, ended the wait for decode's first byte."""
    return exchange.kv_deadline is not None and exchange.kv_deadline < first_byte_due


# ---------------------------------------------------------------------------------------------
# Response ids
# ---------------------------------------------------------------------------------------------


class IdRewriter:
    """Replaces the internal X-Request-Id (which carries engine addresses, docs/protocol.md#toy-proxy) with the uid.

    For streams it rewrites only complete SSE events and holds back a partial one, so an id split
    across two reads is still replaced; reads from vLLM end on event boundaries, so nothing waits.
    """

    def __init__(self, internal_id: str, public_id: str) -> None:
        self._internal = internal_id.encode()
        self._public = public_id.encode()
        self._active = internal_id != public_id
        self._pending = b""

    def whole(self, body: bytes) -> bytes:
        return body.replace(self._internal, self._public) if self._active else body

    def feed(self, data: bytes) -> bytes:
        if not self._active:
            return data
        if not self._pending and data.endswith(b"\n\n"):  # what vLLM's reads are: whole events
            return data.replace(self._internal, self._public)
        if self._pending:
            data = self._pending + data
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + 2 :]
        return data[: end + 2].replace(self._internal, self._public)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest.replace(self._internal, self._public)


def upstream_error_for_client(status: int, body: bytes, leg: str, rewriter: IdRewriter) -> ApiError:
    """What a failed leg means for the client: an engine 4xx is about the request and passes through
    (its body, ids rewritten); anything else is a 502 that names the leg, never the engine's text."""
    if 400 <= status < 500:
        return ApiError(status, f"{leg} engine rejected the request", raw_body=rewriter.whole(body))
    return engine_failed(leg, f"{leg} engine answered HTTP {status}")


# ---------------------------------------------------------------------------------------------
# A decode stream's opening (docs/proxy.md, "Errors")
# ---------------------------------------------------------------------------------------------


def opens_answer(events: bytes, request: ClientRequest) -> bool:
    """Whether whole SSE events at the start of a decode stream begin the answer: a chunk with output
    (a token, even one without text yet, or a finish reason) or an error event (vLLM's own, passed on).
    Chat's role chunk, a usage chunk and ``[DONE]`` do not.

    vLLM 0.31 ends a stream that failed before its first token (finish reason ``error``, e.g. a failed KV
    load with ``kv_load_failure_policy=fail``) with only those: its stream generators skip an output with
    neither token nor text before they look at its finish reason (``completion_stream_generator``,
    ``chat_completion_stream_generator``: "Chunked prefill case, don't return empty chunks"), so the
    client would get HTTP 200 and an empty answer."""
    return answer_opening(stream_chunks(events), request) is not None


def answer_opening(chunks: list[Any], request: ClientRequest) -> Literal["answer", "error"] | None:
    """How chunks already parsed (``stream_chunks``) open the answer (``opens_answer``): ``error`` when the
    first chunk that opens it is an error event, ``answer`` for output or bytes not ours to judge (the client
    gets decode's bytes), None when nothing opens it yet."""
    endpoint = Endpoint.CHAT if request.endpoint == "chat/completions" else Endpoint.COMPLETIONS
    for chunk in chunks:
        if isinstance(chunk, str):
            return "answer"
        info = interpret(chunk, endpoint)
        if info.error is not None:
            return "error"
        if info.carries_token or _finishes(chunk):
            return "answer"
    return None


def stream_chunks(events: bytes) -> list[Any]:
    """The JSON chunks of whole SSE events, ``[DONE]`` left out (a chunk that is not JSON: its text)."""
    chunks = []
    for payload in SseDecoder().feed(events):
        if payload == DONE:
            continue
        try:
            chunks.append(jsoncodec.engine_loads(payload))
        except ValueError:
            chunks.append(payload)
    return chunks


def whole_from_stream(chunks: list[Any], request: ClientRequest) -> dict[str, Any]:
    """The whole answer vLLM sends for a request that was not streamed, from the chunks of the same
    request streamed with ``stream_options.include_usage`` (legs.streams_whole): the envelope of the first
    chunk; one choice (the proxy serves ``n`` = 1) with the text or message joined, logprobs and token ids
    joined, the last finish and stop reason; the usage chunk's usage. vLLM 0.31's stream and whole answers
    are built from the same outputs (``OpenAIServingCompletion``, ``OpenAIServingChat``)."""
    chat = request.endpoint == "chat/completions"
    objects = [c for c in chunks if isinstance(c, dict)]
    answer: dict[str, Any] = {
        k: v for k, v in (objects[0] if objects else {}).items() if k not in ("choices", "usage", "object")
    }
    answer["object"] = "chat.completion" if chat else "text_completion"
    parts = [c for chunk in objects for c in chunk.get("choices") or [] if isinstance(c, dict)]
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = _joined_message([p.get("delta") or {} for p in parts])
    else:
        choice["text"] = "".join(p.get("text") or "" for p in parts)
    logprobs = [p["logprobs"] for p in parts if isinstance(p.get("logprobs"), dict)]
    choice["logprobs"] = _joined_logprobs(logprobs, chat) if logprobs else None
    finished = [p for p in parts if p.get("finish_reason") is not None]
    choice["finish_reason"] = finished[-1]["finish_reason"] if finished else None
    choice["stop_reason"] = finished[-1].get("stop_reason") if finished else None
    if any(p.get("token_ids") is not None for p in parts):
        choice["token_ids"] = [t for p in parts for t in p.get("token_ids") or []]
    prompt_ids = [p["prompt_token_ids"] for p in parts if p.get("prompt_token_ids") is not None]
    if prompt_ids:
        choice["prompt_token_ids"] = prompt_ids[0]
    answer["choices"] = [choice]
    usage = [c["usage"] for c in objects if isinstance(c.get("usage"), dict)]
    if usage:
        answer["usage"] = usage[-1]
    return answer


def _joined_message(deltas: list[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        for key, value in delta.items():
            if key == "role":
                message["role"] = value
            elif isinstance(value, str):
                message[key] = (message.get(key) or "") + value
            elif value is not None:
                message[key] = value
    return message


def _joined_logprobs(logprobs: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    keys = ("content",) if chat else ("text_offset", "token_logprobs", "tokens", "top_logprobs")
    joined = {key: [entry for lp in logprobs for entry in lp.get(key) or []] for key in keys}
    if not chat and joined["text_offset"]:
        # vLLM's whole answer counts each offset on from the previous token's string (a "token_id:N" with
        # return_tokens_as_token_ids), a stream's chunk from the text sent so far
        # (OpenAIServingCompletion._create_completion_logprobs): the whole answer's offsets, recounted.
        offsets = [joined["text_offset"][0]]
        for token in joined["tokens"][:-1]:
            offsets.append(offsets[-1] + len(token if isinstance(token, str) else ""))
        joined["text_offset"] = offsets
    return joined


def _finishes(chunk: Any) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


# ---------------------------------------------------------------------------------------------
# Usage reconciliation (docs/proxy.md, "Usage")
# ---------------------------------------------------------------------------------------------

_USAGE_MARK = b'"prompt_tokens"'  # in a usage object only: the cheap test before any JSON is parsed


def prompt_details(document: Any) -> dict[str, Any] | None:
    """Prefill's ``usage.prompt_tokens_details`` (vLLM's PromptTokenUsageInfo: ``cached_tokens``, the
    client's prefix-cache hit), or None when prefill reported none (vLLM's --enable-prompt-tokens-details off)."""
    usage = document.get("usage") if isinstance(document, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return details if isinstance(details, dict) else None


def _with_details(document: Any, details: dict[str, Any]) -> bool:
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return False
    usage["prompt_tokens_details"] = details
    return True


def merge_usage(body: bytes, details: dict[str, Any]) -> bytes:
    """Decode's whole answer with prefill's prompt_tokens_details in its usage; unchanged without usage."""
    if _USAGE_MARK not in body:
        return body
    try:
        document = json.loads(body)
    except ValueError:
        return body  # not ours to judge: the client gets decode's bytes
    return json.dumps(document, separators=(",", ":")).encode() if _with_details(document, details) else body


def merge_usage_events(data: bytes, details: dict[str, Any]) -> bytes:
    """Whole SSE events (what IdRewriter hands on) with prefill's prompt_tokens_details in each usage:
    the final usage chunk of ``stream_options.include_usage``, every chunk with continuous_usage_stats."""
    if _USAGE_MARK not in data:
        return data
    events = data.split(b"\n\n")
    for index, event in enumerate(events):
        if event.startswith(b"data: ") and _USAGE_MARK in event:
            events[index] = b"data: " + merge_usage(event[6:], details)
    return b"\n\n".join(events)
