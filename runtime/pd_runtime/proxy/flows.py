"""One client request through the engines: write, read and colocated flows.

docs/protocol.md#request-flow describes the legs; docs/protocol.md#read-mode and docs/protocol.md#write-mode the
two flows.

The decisions (which instances, which bodies) come from ``routing`` and ``legs``; this module only
runs the upstream HTTP requests, watches them and relays the answer to a sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp

from pd_runtime.protocol import check_prefill_response, new_request_uid
from pd_runtime.proxy.affinity import prefix_key
from pd_runtime.proxy.answers import (
    chunks_open_answer,
    merge_usage,
    merge_usage_events,
    opens_answer,
    prompt_details,
    stream_chunks,
    whole_from_stream,
)
from pd_runtime.proxy.breaker import OpenReason
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.demand import DemandWindow, asked_output_tokens, reported_prompt_tokens
from pd_runtime.proxy.errors import (
    ApiError,
    decode_without_output,
    kv_transfer_timeout,
    unavailable,
    upstream_failed,
    upstream_timeout,
)
from pd_runtime.proxy.legs import (
    ClientRequest,
    IdRewriter,
    Leg,
    Target,
    TransferIds,
    decode_leg,
    plain_leg,
    prefill_leg,
    streams_whole,
    upstream_error_for_client,
)
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Instance, InstanceRole, Registry
from pd_runtime.proxy.routing import Candidate, Router, Slot, decode_dp_rank
from pd_runtime.proxy.sinks import ClientGone, Sink
from pd_runtime.proxy.status import LastTransfer
from pd_runtime.proxy.tracing import Tracing
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool, UpstreamResponse

log = logging.getLogger(__name__)

Source = Literal["request", "canary"]
UPSTREAM_KEEPALIVE_S = 4.0


class LegFailure(Exception):
    """An upstream leg failed; ``error`` is what the client is told."""

    def __init__(self, leg: str, kind: str, error: ApiError) -> None:
        super().__init__(f"{leg} {kind}: {error.message}")
        self.leg = leg
        self.kind = kind
        self.error = error

    @property
    def engine_failed(self) -> bool:
        """The engine failed, not the request: no connection, a connection lost, an HTTP 5xx, or no
        answer in time. Another instance of the role may well serve the same request."""
        return self.kind in ("unreachable", "broken", "timeout") or (self.kind == "http" and self.error.status >= 500)


@dataclass(frozen=True)
class PrefillAnswer:
    """Prefill's HTTP answer (status 200), parsed."""

    document: Any

    @property
    def kv_transfer_params(self) -> Any:
        return self.document.get("kv_transfer_params") if isinstance(self.document, dict) else None


class NoKvTransfer(LegFailure):
    """Prefill answered but its kv_transfer_params cannot feed a decode (e.g. the prefill was aborted)."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            "prefill", "no_kv", upstream_failed(f"prefill produced no KV transfer: {problem}", "prefill_no_kv")
        )


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


@dataclass(frozen=True)
class Result:
    outcome: str
    verified_transfer: bool = False
    exchange: Exchange | None = None
    """The exchange that answered (its instances and ids), once routed."""


class ProxyCore:
    """Shared state of the request path: registry, router, pooled upstream connections, bookkeeping."""

    def __init__(self, config: ProxyConfig, registry: Registry, router: Router, metrics: ProxyMetrics) -> None:
        self.config = config
        self.registry = registry
        self.router = router
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None  # probes and /v1/models; the legs use ``upstream``
        self.upstream = UpstreamPool(config.timeouts.connect, UPSTREAM_KEEPALIVE_S)
        self.last_transfer: LastTransfer | None = None
        self.in_flight = 0
        self.decode_queue = 0
        self.demand = DemandWindow(time.monotonic())
        self._slot_freed = asyncio.Event()
        self.draining = False
        self._background: set[asyncio.Task[None]] = set()
        self.tracing = Tracing(config.otlp_traces_endpoint) if config.otlp_traces_endpoint else None

    async def start(self) -> None:
        """Pooled connections for all upstream traffic (the toy proxy opens one per leg, docs/protocol.md#toy-proxy)."""
        timeouts = self.config.timeouts
        # Idle connections are dropped before vLLM's own 5 s keep-alive (uvicorn) closes them, so a request
        # never lands on a connection the engine is just closing.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(self._background)
        self.upstream.close()
        if self.session is not None:
            await self.session.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # its last export is blocking HTTP

    # -- entry point ---------------------------------------------------------------------------

    def arrived(self, request: ClientRequest) -> None:
        """A client request arrived (before admission: a refused one is demand too; the canary is not)."""
        self.demand.arrived(time.monotonic(), asked_output_tokens(request.body))

    async def handle(self, request: ClientRequest, sink: Sink, source: Source = "request") -> Result:
        """Serve one request; every failure ends as an OpenAI-style error on the sink, never a raise
        (except cancellation: the client went away, and the upstream legs are closed on the way out).
        With tracing on, inside the request's span (docs/proxy.md, "Trace context")."""
        if self.tracing is None:
            return await self._handle(request, sink, source)
        with self.tracing.request(request.path, request.trace, {"pd.source": source}) as span:
            result = await self._handle(request, sink, source)
            ids = {} if result.exchange is None else {"pd.transfer_id": result.exchange.ids.transfer_id}
            self.tracing.finished(span, result.outcome, ids)
            return result

    async def _handle(self, request: ClientRequest, sink: Sink, source: Source) -> Result:
        self.in_flight += 1
        self.metrics.in_flight.inc()
        exchange: Exchange | None = None
        try:
            exchange = await self._route(request, source)
            try:
                verified = await self._serve(exchange, sink)
            except LegFailure as failure:
                if not self._fail_over(exchange, failure, sink):
                    raise
                exchange = await self._route(request, source)  # a new transfer id; both legs again
                verified = await self._serve(exchange, sink)
            return self._finish(request, exchange, "ok", verified)
        except ApiError as err:
            await sink.error(err)
            return self._finish(
                request, exchange, "unavailable" if err.status == 503 else "rejected", False, err.message
            )
        except LegFailure as failure:
            self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
            try:
                await sink.error(failure.error)
            except ClientGone:
                return self._finish(request, exchange, "cancelled", False)
            return self._finish(request, exchange, f"{failure.leg}_{failure.kind}", False, str(failure))
        except ClientGone:
            return self._finish(request, exchange, "cancelled", False)
        except asyncio.CancelledError:
            self._finish(request, exchange, "cancelled", False)
            raise
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()

    def _finish(
        self, request: ClientRequest, exchange: Exchange | None, outcome: str, verified: bool, detail: str = ""
    ) -> Result:
        self.metrics.request_done(request.endpoint, outcome)
        if exchange is not None:
            log.info(
                "request done transfer_id=%s request=%s source=%s prefill=%s decode=%s outcome=%s ms=%.1f %s",
                exchange.ids.transfer_id,
                exchange.ids.uid,
                exchange.source,
                _address(exchange.prefill),
                _address(exchange.decode),
                outcome,
                1000 * (time.monotonic() - exchange.started),
                detail,
                extra={"transfer_id": exchange.ids.transfer_id, "outcome": outcome},
            )
        return Result(outcome, verified, exchange)

    # -- failover ------------------------------------------------------------------------------

    def _fail_over(self, exchange: Exchange, failure: LegFailure, sink: Sink) -> bool:
        """Whether to serve the request once more elsewhere after ``failure``: only while nothing has
        reached the client, only for a failed engine (not a refused request), only for client requests
        (the canary must see the failure), and only when another live instance of that role exists. The
        failed one's circuit breaker then opens (a timeout or repeated failures opened it already)."""
        target = exchange.prefill if failure.leg == "prefill" else exchange.decode
        if sink.started or not failure.engine_failed or exchange.source != "request" or target is None:
            return False
        now = time.monotonic()
        failed = self.registry.instances.get(target.instance.http_address)
        if failed is None or not any(inst.key != failed.key for inst in self.registry.live(failed.role, now)):
            return False
        if (reason := failed.breaker.failed_over(now)) is not None:
            self._opened(target, reason, failure)
        self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
        self.metrics.failovers.labels(failure.leg).inc()
        log.warning(
            "failing over role=%s http=%s after %s transfer_id=%s",
            failed.role,
            failed.key,
            failure,
            exchange.ids.transfer_id,
            extra={"transfer_id": exchange.ids.transfer_id},
        )
        return True

    # -- circuit breakers ----------------------------------------------------------------------

    def _instance(self, target: Target) -> Instance | None:
        return self.registry.instances.get(target.instance.http_address)

    def _routed(self, exchange: Exchange) -> Exchange:
        for target in (exchange.prefill, exchange.decode):
            if target is not None and (inst := self._instance(target)) is not None:
                inst.breaker.routed()
        return exchange

    def _answered(self, target: Target) -> None:
        inst = self._instance(target)
        if inst is not None and inst.breaker.answered():
            log.info("circuit closed: instance back in rotation role=%s http=%s", inst.role, inst.key)

    def _abandoned(self, target: Target) -> None:
        if (inst := self._instance(target)) is not None:
            inst.breaker.abandoned()

    def _opened(self, target: Target, reason: OpenReason, failure: LegFailure) -> None:
        inst = self._instance(target)
        if inst is None:
            return
        self.metrics.circuit_opens.labels(inst.role, reason).inc()
        log.warning(
            "circuit open: instance out of rotation role=%s http=%s reason=%s after %s",
            inst.role,
            inst.key,
            reason,
            failure,
        )

    def _leg_failed(self, exchange: Exchange, target: Target, failure: LegFailure) -> None:
        """A leg on ``target`` failed: an engine failure counts against the instance it blames (a write-mode
        decode that timed out waiting for prefill blames prefill); a refusal is an answer; a lost KV
        transfer says nothing about the engine."""
        blamed = exchange.prefill if failure.leg == "prefill" and exchange.prefill is not None else target
        if blamed is not target:
            self._abandoned(target)
        if failure.engine_failed:
            inst = self._instance(blamed)
            if inst is not None and (reason := inst.breaker.failed(failure.kind == "timeout", time.monotonic())):
                self._opened(blamed, reason, failure)
        elif failure.kind == "kv_timeout":
            self._abandoned(blamed)
        else:
            self._answered(blamed)

    @contextlib.contextmanager
    def _verdict(self, exchange: Exchange, target: Target) -> Iterator[None]:
        """Tell ``target``'s circuit breaker how the leg inside ended (``breaker``)."""
        try:
            yield
        except LegFailure as failure:
            self._leg_failed(exchange, target, failure)
            raise
        except BaseException:
            self._abandoned(target)  # the client left or the leg was cancelled: no verdict
            raise
        self._answered(target)

    # -- routing -------------------------------------------------------------------------------

    async def _route(self, request: ClientRequest, source: Source) -> Exchange:
        if self.draining:
            raise unavailable("the proxy is shutting down", "shutting_down")
        if self.registry.mode == "colocated":
            uid = new_request_uid()
            ids = TransferIds(uid=uid, transfer_id="", request_id=uid)
            return self._routed(Exchange(request, ids, source, decode=self._pick("E", None, request, time.monotonic())))
        # One live set per role per request: the prefill set is checked before any wait for a decode slot
        # and routed from unless that wait ran (the registry may have changed meanwhile).
        now = time.monotonic()
        prefills: list[Instance] | None = self.registry.live("P", now)
        if not prefills:
            raise _no_live("P")  # before waiting for a decode slot
        decode_slot = self._pick_within("D", "D", self.config.decode_max_in_flight, now)
        if decode_slot is None:
            decode_slot = await self._decode_slot()
            prefills = None
        prefill = self._pick("P", "P", request, now, prefills)
        if prefill.instance.dp_size == decode_slot.instance.dp_size > 1:
            # Both legs on one rank (PR #46115): the decode rank, which was chosen below its in-flight limit.
            prefill = Target(prefill.instance, decode_slot.dp_rank)
        decode = Target(
            decode_slot.instance,
            decode_dp_rank(
                prefill.dp_rank, prefill.instance.dp_size, decode_slot.dp_rank, decode_slot.instance.dp_size
            ),
        )
        return self._routed(
            Exchange(request, TransferIds.mint(prefill.instance, decode.instance), source, prefill, decode)
        )

    def _pick(
        self,
        pool: str,
        role: InstanceRole | None,
        request: ClientRequest,
        now: float,
        live: list[Instance] | None = None,
    ) -> Target:
        """The engine that computes the prompt: under ``prefix_affinity`` placed by the prompt's prefix."""
        key = None
        if self.router.policy == "prefix_affinity":
            key = prefix_key(request.body, self.config.affinity_prefix_tokens)
        target = self._pick_within(pool, role, 0, now, live, key)
        assert target is not None  # without a limit there is always a slot
        return target

    def _pick_within(
        self,
        pool: str,
        role: InstanceRole | None,
        limit: int,
        now: float,
        live: list[Instance] | None = None,
        key: bytes | None = None,
    ) -> Target | None:
        """A slot with fewer than ``limit`` requests in flight (0: any), None when all are full; ``live``:
        the role's live instances at ``now`` if the caller has them already."""
        if live is None:
            live = self.registry.live(role, now)
        if not live:
            raise _no_live(role)
        by_key: dict[str, Instance] = {inst.key: inst for inst in live}
        fresh = self.registry.fresh_load
        candidates = [Candidate(inst.key, inst.registration.dp_size, fresh(inst, now)) for inst in live]
        slot = self.router.pick(pool, candidates, limit, key)
        return None if slot is None else Target(by_key[slot.key].registration, slot.dp_rank)

    async def _decode_slot(self) -> Target:
        """A decode DP rank with fewer than --decode-max-in-flight requests (its max_num_seqs).

        Past max_num_seqs vLLM queues a request without allocating its blocks, so in write mode its block
        list reaches prefill late, and after defer_timeout prefill drops the transfer. Waiting here instead
        starts neither leg: prefill's clock does not run. The wait is bounded by one more full batch per
        rank and by the first-byte timeout; past either the client gets 503 + Retry-After.
        """
        limit = self.config.decode_max_in_flight
        deadline = asyncio.get_running_loop().time() + self.config.timeouts.first_byte
        while (target := self._pick_within("D", "D", limit, time.monotonic())) is None:
            ranks = sum(inst.registration.dp_size for inst in self.registry.live("D", time.monotonic()))
            if self.decode_queue >= limit * ranks:
                raise _decode_full(limit)
            freed = self._slot_freed
            self.decode_queue += 1
            self.metrics.decode_queue.inc()
            try:
                async with asyncio.timeout_at(deadline):
                    await freed.wait()
            except TimeoutError:
                raise _decode_full(limit) from None
            finally:
                self.decode_queue -= 1
                self.metrics.decode_queue.dec()
        return target

    # -- flows ---------------------------------------------------------------------------------

    async def _serve(self, exchange: Exchange, sink: Sink) -> bool:
        """Run the flow for the mode; True when a P->D transfer was verified (both legs succeeded)."""
        slots = [_slot(t) for t in (exchange.prefill, exchange.decode) if t is not None]
        for slot in slots:
            self.router.acquire(slot)
        try:
            if exchange.prefill is None:
                assert exchange.decode is not None
                await self._relay(exchange, exchange.decode, self._plain(exchange, exchange.decode), "engine", sink)
                return False
            if self.registry.transfer_mode == "READ":
                return await self._read_flow(exchange, sink)
            return await self._write_flow(exchange, sink)
        finally:
            for slot in slots:
                self.router.release(slot)
            if self.decode_queue:  # requests waiting for a decode slot look again (none: no Event to renew)
                self._slot_freed.set()
                self._slot_freed = asyncio.Event()

    def _plain(self, exchange: Exchange, target: Target) -> Leg:
        return plain_leg(exchange.request, target, exchange.ids.uid, self.config.engine_api_key)

    def _decode_leg(self, exchange: Exchange, prefill_params: dict[str, Any] | None) -> Leg:
        assert exchange.prefill is not None and exchange.decode is not None
        return decode_leg(
            exchange.request,
            exchange.prefill,
            exchange.decode,
            exchange.ids,
            self.config.max_tokens_policy,
            self.config.engine_api_key,
            prefill_params,
        )

    async def _read_flow(self, exchange: Exchange, sink: Sink) -> bool:
        """docs/protocol.md#read-mode: strictly serial; D is sent only after P's answer was validated."""
        assert exchange.decode is not None
        answer = await self._prefill(exchange)
        params = answer.kv_transfer_params
        problem = check_prefill_response(params, exchange.ids.transfer_id)
        if problem:
            await self._without_kv(exchange, sink, NoKvTransfer(problem))
            return False
        exchange.prefill_answered(self.config.timeouts.kv_wait)
        await self._relay(exchange, exchange.decode, self._decode_leg(exchange, params), "decode", sink)
        self._record_transfer(exchange)
        return True

    async def _write_flow(self, exchange: Exchange, sink: Sink) -> bool:
        """docs/protocol.md#write-mode: both legs at once, but P is watched; if it fails, D is cancelled.

        D goes out first: it must allocate blocks and send them to P before P's KV writes can start.
        """
        assert exchange.decode is not None
        decode = asyncio.create_task(
            self._relay(exchange, exchange.decode, self._decode_leg(exchange, None), "decode", sink)
        )
        prefill = asyncio.create_task(self._prefill_with_kv(exchange))
        handed_off = False
        try:
            prefill_failure: BaseException | None = None
            done, _ = await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_COMPLETED)
            if prefill in done and (prefill_failure := prefill.exception()) is not None:
                await _cancel(decode)
            elif not decode.done():
                await _settled(decode)  # prefill answered: from here only decode's end matters
            if prefill_failure is not None and (decode.cancelled() or decode.exception() is not None):
                if isinstance(prefill_failure, NoKvTransfer):
                    await self._without_kv(exchange, sink, prefill_failure)
                    return False
                raise prefill_failure
            decode.result()
            if not prefill.done() and exchange.source == "request":
                handed_off = True
                self._spawn(self._await_late_prefill(exchange, prefill))
                return False
            await asyncio.wait({prefill})  # the canary waits for P's own answer to verify the transfer
            prefill_failure = prefill.exception()
            if prefill_failure is None:
                self._record_transfer(exchange)
                return True
            log.warning(
                "prefill failed after decode finished transfer_id=%s: %s", exchange.ids.transfer_id, prefill_failure
            )
            return False
        finally:
            if not handed_off:
                await _cancel(prefill)
            await _cancel(decode)

    async def _await_late_prefill(self, exchange: Exchange, prefill: asyncio.Task[Any]) -> None:
        """D finished before P's HTTP answer arrived: record the transfer once P confirms it."""
        try:
            await prefill
        except LegFailure as failure:
            self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
            log.warning("prefill failed after decode finished transfer_id=%s: %s", exchange.ids.transfer_id, failure)
            return
        self._record_transfer(exchange)

    async def _without_kv(self, exchange: Exchange, sink: Sink, missing: NoKvTransfer) -> None:
        """Prefill gave no KV for decode (any decode leg is already cancelled): an aborted prefill, or
        one that stopped although ``min_tokens: 1`` masked its stop tokens (a grammar allowing nothing
        else). Never a plain request to decode: vLLM < 0.32 (write) / 0.33 (read) would wait for KV
        forever or decode from nothing. The configured fallback decides."""
        assert exchange.prefill is not None
        if sink.started:
            raise missing
        if self.config.no_kv_fallback == "error":
            self.metrics.no_kv.labels("error").inc()
            raise missing
        self.metrics.no_kv.labels("prefill_plain").inc()
        log.warning("serving on prefill as a plain request transfer_id=%s: %s", exchange.ids.transfer_id, missing)
        plain = self._plain(exchange, exchange.prefill)
        await self._relay(exchange, exchange.prefill, plain, "prefill", sink)

    def _record_transfer(self, exchange: Exchange) -> None:
        assert exchange.prefill is not None and exchange.decode is not None
        self.last_transfer = LastTransfer(
            transfer_id=exchange.ids.transfer_id,
            completed_at=datetime.now(UTC),
            prefill=exchange.prefill.instance.http_address,
            decode=exchange.decode.instance.http_address,
            source=exchange.source,
        )
        self.metrics.last_transfer.set(time.time())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- legs ----------------------------------------------------------------------------------

    def _post(self, target: Target, leg: Leg, name: str) -> contextlib.AbstractAsyncContextManager[UpstreamResponse]:
        instance, known = target.instance, self._instance(target)
        host = known.http_host if known is not None else instance.http_host or instance.host
        if self.tracing is None:
            return self.upstream.post(host, instance.http_port, leg.path, leg.headers, leg.encoded())
        return self.tracing.leg(
            name,
            instance.http_address,
            leg.headers,
            lambda headers: self.upstream.post(host, instance.http_port, leg.path, headers, leg.encoded()),
        )

    async def _prefill_with_kv(self, exchange: Exchange) -> None:
        """Write mode: a P answer without kv_transfer_params means no KV will ever reach D."""
        answer = await self._prefill(exchange)
        if not isinstance(answer.kv_transfer_params, dict):
            problem = "kv_transfer_params is null (the prefill was aborted or did not end length-capped)"
            raise NoKvTransfer(problem)
        exchange.prefill_answered(self.config.timeouts.kv_wait)

    async def _prefill(self, exchange: Exchange) -> PrefillAnswer:
        """POST the P leg and return its answer (a failure raises LegFailure)."""
        assert exchange.prefill is not None
        with self._verdict(exchange, exchange.prefill):
            return await self._prefill_leg(exchange)

    async def _prefill_leg(self, exchange: Exchange) -> PrefillAnswer:
        assert exchange.prefill is not None and exchange.decode is not None
        leg = prefill_leg(exchange.request, exchange.prefill, exchange.decode, exchange.ids, self.config.engine_api_key)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.timeouts.prefill):
                async with self._post(exchange.prefill, leg, "prefill") as resp:
                    status, body = resp.status, await resp.read()
        except TimeoutError as exc:
            raise LegFailure(
                "prefill", "timeout", upstream_timeout(f"prefill took longer than {self.config.timeouts.prefill:g} s")
            ) from exc
        except UpstreamError as exc:
            raise LegFailure(
                "prefill", "unreachable", upstream_failed("prefill engine unreachable", "prefill_failed")
            ) from exc
        finally:
            self.metrics.leg_seconds.labels("prefill").observe(time.monotonic() - started)
        if status != 200:
            raise LegFailure("prefill", "http", upstream_error_for_client(status, body, "prefill", exchange.rewriter))
        try:
            document = json.loads(body)  # never the client's: decode answers it
        except ValueError as exc:
            raise LegFailure(
                "prefill", "protocol", upstream_failed("prefill answered invalid JSON", "prefill_failed")
            ) from exc
        if exchange.source == "request" and (prompt := reported_prompt_tokens(document)) is not None:
            self.demand.prompt_measured(time.monotonic(), prompt)
        exchange.prompt_details = prompt_details(document)
        return PrefillAnswer(document)

    async def _relay(self, exchange: Exchange, target: Target, leg: Leg, name: str, sink: Sink) -> None:
        """POST a decode (or colocated, or plain prefill) leg and pass its answer through, SSE chunk by chunk."""
        with self._verdict(exchange, target):
            if name == "decode" and streams_whole(exchange.request):
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
                self._post(target, leg, "decode") as resp,
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
                self._post(target, leg, name) as resp,
            ):
                if resp.status != 200:
                    body = await resp.read()
                    raise LegFailure(
                        name, "http", upstream_error_for_client(resp.status, body, name, exchange.rewriter)
                    )
                content_type = resp.headers.get("content-type", "application/json")
                if not content_type.startswith("text/event-stream"):
                    body = await resp.read()
                    self._answered(target)
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
                        self._answered(target)
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


def _no_live(role: InstanceRole | None) -> ApiError:
    what = {"P": "prefill", "D": "decode"}.get(role or "", "engine")
    return unavailable(f"no live {what} instance is registered", f"no_{what}_instance")


def _decode_full(limit: int) -> ApiError:
    return unavailable(
        f"every decode engine already has {limit} requests in flight (its max_num_seqs) and a full queue",
        "decode_at_capacity",
    )


def _streams_usage(request: ClientRequest) -> bool:
    """Whether the client asked for usage in its stream (stream_options.include_usage or continuous stats)."""
    options = request.body.get("stream_options") or {}
    return bool(options.get("include_usage") or options.get("continuous_usage_stats"))


def _kv_bound(exchange: Exchange, first_byte_due: float) -> bool:
    """Whether the kv wait, not the first-byte timeout, ended the wait for decode's first byte."""
    return exchange.kv_deadline is not None and exchange.kv_deadline < first_byte_due


def _slot(target: Target) -> Slot:
    return Slot(target.instance.http_address, target.dp_rank)


def _address(target: Target | None) -> str:
    return "-" if target is None else target.instance.http_address


async def _settled(task: asyncio.Task[Any]) -> None:
    """Wait for ``task`` to end however it ends, without asyncio.wait's per-call future and callbacks
    (a second wait per request showed in the profile). Only our own cancellation propagates."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        pass  # the task's failure: the caller reads it from the task


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel a leg and wait for it to close its connection (vLLM aborts a request on disconnect)."""
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: the failure, if any, was already handled or superseded
