"""One client request through the engines: placed, served by the write, read or colocated flow, failed
over once, and its outcome told (docs/protocol.md#request-flow; docs/protocol.md#read-mode and
docs/protocol.md#write-mode the two flows).

``ProxyCore`` is what the server and the canary call. The parts it composes each do one job:
``placement`` chooses the instances, ``relay`` carries a leg's answer to the client, ``circuits``
keeps each instance's circuit breaker; the bodies come from ``legs``. What is left here is the order
of the legs (which run, when, and what a failure of one means for the others) and the prefill leg,
whose answer only the proxy reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp

from pd_runtime.protocol import check_prefill_response
from pd_runtime.proxy import jsoncodec, migration
from pd_runtime.proxy.circuits import Circuits
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.contract import after_failure, phase
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.demand import DemandWindow, reported_prompt_tokens
from pd_runtime.proxy.errors import (
    ApiError,
    LegFailure,
    NoKvTransfer,
    deadline_exceeded,
    engine_failed,
    unavailable,
)
from pd_runtime.proxy.legs import ClientRequest, Target, decode_leg, plain_leg, prefill_leg
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.placement import Placement
from pd_runtime.proxy.registry import Registry
from pd_runtime.proxy.relay import Exchange, Relay, Source, prompt_details, upstream_error_for_client
from pd_runtime.proxy.routing import Router
from pd_runtime.proxy.sinks import ClientGone, ContinuedSink, Sink
from pd_runtime.proxy.status import LastTransfer
from pd_runtime.proxy.timer import RunningLoop, Timer
from pd_runtime.proxy.tracing import Tracing
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool

log = logging.getLogger(__name__)

UPSTREAM_KEEPALIVE_S = 4.0


class PrefillAnswer:
    """Prefill's HTTP answer (status 200), parsed. This and ``Result``, built per request, are plain classes
    with slots, not dataclasses (``legs.ClientRequest`` says why)."""

    __slots__ = ("document",)

    def __init__(self, document: Any) -> None:
        self.document = document

    @property
    def kv_transfer_params(self) -> Any:
        return self.document.get("kv_transfer_params") if isinstance(self.document, dict) else None


class Result:
    __slots__ = ("exchange", "outcome", "verified_transfer")

    def __init__(self, outcome: str, verified_transfer: bool = False, exchange: Exchange | None = None) -> None:
        self.outcome = outcome
        self.verified_transfer = verified_transfer
        self.exchange = exchange
        """The exchange that answered (its instances and ids), once routed."""

    def __repr__(self) -> str:
        return f"Result(outcome={self.outcome!r}, verified_transfer={self.verified_transfer!r})"


class ProxyCore:
    """Shared state of the request path: registry, router, pooled upstream connections, bookkeeping."""

    def __init__(self, config: ProxyConfig, registry: Registry, router: Router, metrics: ProxyMetrics) -> None:
        self.config = config
        self.registry = registry
        self.router = router
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None  # probes and /v1/models; the legs use ``upstream``
        self.upstream = UpstreamPool(config.timeouts.connect, UPSTREAM_KEEPALIVE_S)
        self._last_transfer: tuple[str, Target, Target, Source, float] | None = None  # ``last_transfer``'s facts
        metrics.last_transfer.set_function(self._last_transfer_time)
        self.in_flight = 0
        metrics.in_flight.set_function(self._in_flight)
        self.demand = DemandWindow(time.monotonic())
        self.draining = False
        self._background: set[asyncio.Task[Any]] = set()  # late prefill legs
        self.loop = RunningLoop()
        self.circuits = Circuits(registry, metrics)
        self.placement = Placement(config, registry, router, self.circuits, metrics, self.loop)
        tracing = Tracing(config.otlp_traces_endpoint) if config.otlp_traces_endpoint else None
        self.relay = Relay(config, self.upstream, self.circuits, metrics, tracing)

    @property
    def tracing(self) -> Tracing | None:
        """The proxy's own spans: the request's here, its legs' in ``relay``."""
        return self.relay.tracing

    @tracing.setter
    def tracing(self, tracing: Tracing | None) -> None:
        self.relay.tracing = tracing

    @property
    def decode_queue(self) -> int:
        """Requests waiting for a decode slot (``placement``)."""
        return self.placement.decode_queue

    def reconfigure(self, config: ProxyConfig) -> None:
        """Run with new reloadable settings (reload.py): requests already under way keep their deadlines."""
        self.config = self.placement.config = self.relay.config = config
        self.router.policy = config.policy
        self.router.max_imbalance = config.affinity_max_imbalance
        self.upstream.connect_timeout = config.timeouts.connect

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

    async def handle(
        self, request: ClientRequest, sink: Sink, source: Source = "request", deadline: Deadline | None = None
    ) -> Result:
        """Serve one request by ``deadline`` (its one deadline, set when it arrived; the canary's starts
        here); every failure ends as an OpenAI-style error on the sink, never a raise (except cancellation:
        the client went away, and the upstream legs are closed on the way out). With tracing on, inside the
        request's span (docs/proxy.md, "Trace context")."""
        if deadline is None:
            deadline = Deadline.after(self.loop.time(), self.config.timeouts.response)
        self.in_flight += 1
        try:
            if self.tracing is None:
                return await self._handle(request, sink, source, deadline)
            with self.tracing.request(request.path, request.trace, {"pd.source": source}) as span:
                result = await self._handle(request, sink, source, deadline)
                ids = {} if result.exchange is None else {"pd.transfer_id": result.exchange.ids.transfer_id}
                self.tracing.finished(span, result.outcome, ids)
                return result
        finally:
            self.in_flight -= 1

    async def _handle(self, request: ClientRequest, sink: Sink, source: Source, deadline: Deadline) -> Result:
        """Awaits nothing inside an except clause (docs/proxy.md, "Compiled request path"): a failure is
        answered, or the request failed over, after the clause that caught it."""
        exchange: Exchange | None = None
        try:
            exchange = await self._exchange(request, source, deadline)
            failed_over = False
            try:
                exchange, verified = await self._serve_migrating(exchange, sink)
            except LegFailure as failure:
                if not self._after_failure(exchange, failure, sink):
                    raise
                failed_over = True
            if failed_over:
                exchange = await self._exchange(request, source, deadline)  # a new transfer id; both legs again
                exchange, verified = await self._serve_migrating(exchange, sink)
            return self._finish(request, exchange, "ok", verified)
        except ApiError as err:  # placement's: no instance, decode at capacity, the deadline while waiting
            error, outcome, detail = err, err.outcome, err.message
        except LegFailure as failure:
            self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
            error, outcome, detail = failure.error, f"{failure.leg}_{failure.kind}", str(failure)
        except ClientGone:
            return self._gone(request, exchange, sink)
        except asyncio.CancelledError:
            self._gone(request, exchange, sink)
            raise
        return await self._failed(request, exchange, error, sink, outcome, detail)

    async def _failed(
        self, request: ClientRequest, exchange: Exchange | None, error: ApiError, sink: Sink, outcome: str, detail: str
    ) -> Result:
        """The client told of ``error``: an HTTP error before its answer's head, an error event, ``[DONE]`` and
        the stream's end after its first byte (``Sink.error``); counted by cause and phase."""
        started = sink.started
        try:
            await sink.error(error)
        except ClientGone:
            return self._gone(request, exchange, sink)
        if error.cause is not None:
            self.metrics.failed(error.cause, phase(started))
        return self._finish(request, exchange, outcome, False, detail)

    def _gone(self, request: ClientRequest, exchange: Exchange | None, sink: Sink) -> Result:
        """The client went away: its legs' connections are closed on the way out (vLLM aborts them)."""
        self.metrics.failed("client_gone", phase(sink.started))
        return self._finish(request, exchange, "cancelled", False)

    def _finish(
        self, request: ClientRequest, exchange: Exchange | None, outcome: str, verified: bool, detail: str = ""
    ) -> Result:
        self.metrics.request_done(request.endpoint, outcome)
        # At DEBUG: built and written per request, the line cost 7 % of the request path's instructions
        # at INFO (docs/benchmarks.md); the metrics count every outcome, failures are logged as warnings.
        if exchange is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
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

    async def _exchange(self, request: ClientRequest, source: Source, deadline: Deadline) -> Exchange:
        """The request placed on its instances, with the ids of its transfer."""
        if self.draining:
            raise unavailable("the proxy is shutting down", "shutting_down")
        prefill, decode, ids = await self.placement.place(request, deadline, selective=source == "request")
        return Exchange(request, ids, source, prefill, decode, deadline=deadline, loop=self.loop.get())

    def _after_failure(self, exchange: Exchange, failure: LegFailure, sink: Sink) -> bool:
        """The one place that decides what becomes of a request whose leg failed (``contract.after_failure``):
        True to serve it once more elsewhere, when that step is chosen and another live instance of the
        failed role exists (``placement``); False to tell the client, as an HTTP error or, once its stream
        has begun, an error event and ``[DONE]``."""
        step = after_failure(failure, sink.started, exchange.source == "canary", failed_over=False)
        target = exchange.prefill if failure.leg == "prefill" else exchange.decode
        if step != "fail_over" or target is None:
            return False
        return self.placement.fails_over(target, failure, exchange.ids.transfer_id)

    async def _serve_migrating(self, exchange: Exchange, sink: Sink) -> tuple[Exchange, bool]:
        """``_serve``, continued on another decode engine each time its decode stream breaks after tokens
        reached the client, at most --migration-limit times (``migration``; docs/proxy.md, "Migration").
        Returns the exchange that finished the request and whether its transfer was verified."""
        request, limit = exchange.request, self.config.migration_limit
        tokens: migration.StreamTokens | None = None
        alone = False
        if exchange.prefill is not None and exchange.source == "request" and migration.trackable(request, limit):
            # a stream is read for its tokens only where another decode engine could continue it: reading
            # costs about a tenth of a request's CPU (docs/benchmarks.md), which a 1P1D pod never needs
            alone = not self.placement.registry.several("D")
            if not alone:
                tokens = migration.StreamTokens(request)
                exchange.request = migration.tracked_request(request)
                exchange.stream_filter = tokens.feed
        migrations = 0
        while True:
            try:
                verified = await self._serve(exchange, sink)
            except LegFailure as failure:
                if migrations:
                    self.metrics.migrations.labels("failed").inc()
                decision = migration.decide(failure, request, tokens, sink.started, migrations, limit, alone)
                if decision is None:
                    raise
                if decision != "migrate":
                    self.metrics.migrations.labels(decision).inc()
                    raise
                broken = failure  # continued after the except clause, as _handle's failover
            else:
                if migrations:
                    self.metrics.migrations.labels("ok").inc()
                return exchange, verified
            assert tokens is not None and exchange.decode is not None
            exchange = await self._continue(exchange, broken, migration.continuation(request, tokens))
            assert exchange.decode is not None
            engine = self.circuits.instance(exchange.decode)
            by_tokens = migration.offsets_by_tokens(engine.vllm_version if engine is not None else None)
            exchange.stream_filter = migration.Splice(tokens, by_tokens).feed
            sink = sink if migrations else ContinuedSink(sink)
            migrations += 1

    async def _continue(self, broken: Exchange, failure: LegFailure, request: ClientRequest) -> Exchange:
        """The exchange that continues a request whose decode stream broke, on another decode engine; the
        failure stands when none is routable."""
        assert broken.decode is not None
        try:
            if self.placement.leaves(broken.decode, failure, broken.ids.transfer_id, "migrating"):
                return await self._exchange(request, broken.source, broken.deadline)
        except ApiError:
            pass  # no prefill, or no decode slot in time: the client is told of the broken stream
        self.metrics.migrations.labels("no_instance").inc()
        raise failure

    # -- flows ---------------------------------------------------------------------------------

    async def _serve(self, exchange: Exchange, sink: Sink) -> bool:
        """Run the flow for the mode; True when a P->D transfer was verified (both legs succeeded)."""
        with self.placement.holding(exchange.prefill, exchange.decode):
            if exchange.prefill is None:  # colocated, or decode alone (``disaggregation``)
                assert exchange.decode is not None
                name = "engine" if self.registry.mode == "colocated" else "decode"
                await self._plain(exchange, exchange.decode, name, sink)
                return False
            if self.registry.transfer_mode == "READ":
                return await self._read_flow(exchange, sink)
            return await self._write_flow(exchange, sink)

    async def _read_flow(self, exchange: Exchange, sink: Sink) -> bool:
        """docs/protocol.md#read-mode: strictly serial; D is sent only after P's answer was validated."""
        try:
            params = await self._prefill(exchange, read_mode=True)
        except NoKvTransfer as missing:
            without_kv = missing  # served after the except clause, as _handle's failures
        else:
            await self._decode(exchange, params, sink)
            self._record_transfer(exchange)
            return True
        await self._without_kv(exchange, sink, without_kv)
        return False

    async def _write_flow(self, exchange: Exchange, sink: Sink) -> bool:
        """docs/protocol.md#write-mode: both legs at once, but P is watched; if it fails, D is cancelled.

        D goes out first: it must allocate blocks and send them to P before P's KV writes can start. It is
        relayed in the request's own task, whose first wait starts prefill's; a callback on prefill's task
        (``_PrefillWatch``), not a wait over two leg tasks, cancels D when P fails.
        """
        prefill = asyncio.create_task(self._prefill(exchange, read_mode=False))
        outcome: bool | BaseException
        try:
            outcome = await self._write_legs(exchange, sink, prefill)
        except BaseException as failure:  # re-raised once prefill's leg is closed
            outcome = failure
        if prefill not in self._background:  # unless it was left to finish late
            # Not in a finally clause: compiled by mypyc, a finally that awaited lost the exception it was
            # to re-raise (a cancelled request returned None).
            await _cancel(prefill)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _write_legs(self, exchange: Exchange, sink: Sink, prefill: asyncio.Task[Any]) -> bool:
        """Decode relayed while ``prefill`` runs: True when the transfer was verified."""
        watch = _PrefillWatch(prefill, exchange.loop)
        try:
            await self._decode(exchange, None, sink)
        except asyncio.CancelledError:
            if not watch.stop():
                raise  # the request's own cancellation: its client left
        except Exception:
            watch.stop()
            if _failure(prefill) is None:
                raise  # decode failed first
        else:
            watch.stop()
            if not prefill.done() and exchange.source == "request":
                self._finish_late(exchange, prefill)
                return False
            await _settled(prefill)  # the canary waits for P's own answer to verify the transfer
            if (late := _failure(prefill)) is None:
                self._record_transfer(exchange)
                return True
            log.warning("prefill failed after decode finished transfer_id=%s: %s", exchange.ids.transfer_id, late)
            return False
        prefill_failure = _failure(prefill)  # D was cancelled for it, or failed beside it: P's failure stands
        assert prefill_failure is not None
        if isinstance(prefill_failure, NoKvTransfer):
            await self._without_kv(exchange, sink, prefill_failure)
            return False
        raise prefill_failure

    def _finish_late(self, exchange: Exchange, prefill: asyncio.Task[Any]) -> None:
        """D finished before P's HTTP answer arrived: P's task runs on in the background (cancelled by
        ``close``), and the transfer is recorded once P confirms it (a callback, not a task waiting on it)."""
        self._background.add(prefill)
        prefill.add_done_callback(self._background.discard)
        prefill.add_done_callback(lambda task: self._late_prefill_done(exchange, task))

    def _late_prefill_done(self, exchange: Exchange, prefill: asyncio.Task[Any]) -> None:
        if prefill.cancelled():
            return
        failure = prefill.exception()
        if failure is None:
            self._record_transfer(exchange)
        elif isinstance(failure, LegFailure):
            self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
            log.warning("prefill failed after decode finished transfer_id=%s: %s", exchange.ids.transfer_id, failure)
        else:
            raise failure  # a bug: the loop's exception handler logs it

    async def _prefill(self, exchange: Exchange, read_mode: bool) -> Any:
        """The prefill leg; its kv_transfer_params, checked as the transfer mode needs them for decode (a
        failed leg raises LegFailure, an answer whose KV cannot feed decode NoKvTransfer). From here
        decode's first byte is due within the kv wait (``Exchange.prefill_answered``)."""
        assert exchange.prefill is not None
        with self.circuits.verdict(exchange.prefill, exchange.prefill):
            params = (await self._prefill_leg(exchange)).kv_transfer_params
        problem: str | None = None
        if read_mode:
            problem = check_prefill_response(params, exchange.ids.transfer_id)
        elif not isinstance(params, dict):  # write mode: no KV will ever reach decode
            problem = "kv_transfer_params is null (the prefill was aborted or did not end length-capped)"
        if problem:
            raise NoKvTransfer(problem)
        exchange.prefill_answered(self.config.timeouts.kv_wait)
        return params

    async def _prefill_leg(self, exchange: Exchange) -> PrefillAnswer:
        assert exchange.prefill is not None and exchange.decode is not None
        leg = prefill_leg(exchange.request, exchange.prefill, exchange.decode, exchange.ids, self.config.engine_api_key)
        started = time.monotonic()
        bound = self.config.timeouts.prefill
        due = exchange.deadline.bound(exchange.loop.time() + bound)
        try:
            async with Timer(due, exchange.loop), self.relay.open_leg(exchange.prefill, leg, "prefill") as resp:
                status, body = resp.status, await resp.read()
        except TimeoutError as exc:
            if exchange.deadline.ended(due):
                failure = deadline_exceeded(exchange.deadline.describe("before prefill answered"))
                raise LegFailure("prefill", "deadline", failure) from exc
            hung = engine_failed("prefill", f"prefill engine hung: no answer within {bound:g} s (--prefill-timeout)")
            raise LegFailure("prefill", "timeout", hung) from exc
        except UpstreamError as exc:
            raise LegFailure("prefill", "unreachable", engine_failed("prefill", "prefill engine unreachable")) from exc
        finally:
            self.metrics.leg_seconds.labels("prefill").observe(time.monotonic() - started)
        if status != 200:
            raise LegFailure("prefill", "http", upstream_error_for_client(status, body, "prefill", exchange.rewriter))
        try:
            document = jsoncodec.engine_loads(body)  # never the client's: decode answers it
        except ValueError as exc:
            raise LegFailure("prefill", "protocol", engine_failed("prefill", "prefill answered invalid JSON")) from exc
        if exchange.source == "request" and (prompt := reported_prompt_tokens(document)) is not None:
            self.demand.prompt_measured(time.monotonic(), prompt)
        exchange.prompt_details = prompt_details(document)
        return PrefillAnswer(document)

    async def _decode(self, exchange: Exchange, prefill_params: dict[str, Any] | None, sink: Sink) -> None:
        """The decode leg; ``prefill_params``: prefill's kv_transfer_params in read mode, None in write mode."""
        assert exchange.prefill is not None and exchange.decode is not None
        leg = decode_leg(
            exchange.request,
            exchange.prefill,
            exchange.decode,
            exchange.ids,
            self.config.max_tokens_policy,
            self.config.engine_api_key,
            prefill_params,
        )
        await self.relay.to_client(exchange, exchange.decode, leg, "decode", sink)

    async def _plain(self, exchange: Exchange, target: Target, name: str, sink: Sink) -> None:
        """The request as the client sent it, on one engine: colocated, decode alone, or prefill when it gave
        no KV."""
        leg = plain_leg(exchange.request, target, exchange.ids.uid, self.config.engine_api_key)
        await self.relay.to_client(exchange, target, leg, name, sink)

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
        await self._plain(exchange, exchange.prefill, "prefill", sink)

    def _record_transfer(self, exchange: Exchange) -> None:
        """The newest verified transfer's facts, kept as they are: ``last_transfer`` and the gauge build what
        they show only when read (a dataclass, a datetime and a locked gauge's set were per request)."""
        assert exchange.prefill is not None and exchange.decode is not None
        self._last_transfer = (
            exchange.ids.transfer_id,
            exchange.prefill,
            exchange.decode,
            exchange.source,
            time.time(),
        )

    @property
    def last_transfer(self) -> LastTransfer | None:
        """The newest transfer whose prefill and decode legs both succeeded (``/status``)."""
        if self._last_transfer is None:
            return None
        transfer_id, prefill, decode, source, at = self._last_transfer
        return LastTransfer(
            transfer_id=transfer_id,
            completed_at=datetime.fromtimestamp(at, UTC),
            prefill=prefill.instance.http_address,
            decode=decode.instance.http_address,
            source=source,
        )

    def _in_flight(self) -> float:
        """pd_proxy_in_flight: the requests in progress, read when scraped."""
        return self.in_flight

    def _last_transfer_time(self) -> float:
        """pd_proxy_last_transfer_timestamp_seconds: Unix time of the last verified transfer (0: none yet)."""
        return 0.0 if self._last_transfer is None else self._last_transfer[-1]


def _address(target: Target | None) -> str:
    return "-" if target is None else target.instance.http_address


class _PrefillWatch:
    """While a write-mode decode leg runs in the request's task, prefill's failure cancels it (as
    asyncio.TaskGroup cancels its other children): one callback on prefill's task instead of a task for
    decode and asyncio.wait over both (docs/benchmarks.md)."""

    __slots__ = ("_cancelled", "_task")

    def __init__(self, prefill: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> None:
        self._task = asyncio.current_task(loop)
        self._cancelled = False
        prefill.add_done_callback(self._prefill_done)

    def _prefill_done(self, prefill: asyncio.Task[Any]) -> None:
        if self._task is not None and _failure(prefill) is not None:
            self._cancelled = True
            self._task.cancel()

    def stop(self) -> bool:
        """Decode is over: prefill's end cancels nothing from here. True when this watch cancelled decode
        and nothing else cancelled the request's task (the cancellation is then taken back)."""
        task, self._task = self._task, None
        return self._cancelled and task is not None and task.uncancel() == 0


def _failure(task: asyncio.Task[Any]) -> BaseException | None:
    """How a finished leg task failed (None: it succeeded, or is not done, or was cancelled)."""
    return None if not task.done() or task.cancelled() else task.exception()


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
