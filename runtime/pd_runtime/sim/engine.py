"""The simulated engine behind the HTTP server: routes each request to its leg and times it.

Legs: ``plain`` (a colocated request, or one without kv_transfer_params), ``producer`` (P leg:
``do_remote_decode``; one token, then the blocks are held for the consumer) and ``consumer`` (D leg:
``do_remote_prefill``; waits for the KV over the side channels, then decodes). The peer is read from
X-Request-Id with the engines' regexes, else from the explicit remote_* keys (docs/protocol.md#request-ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from pd_runtime import protocol
from pd_runtime.prefix_cache import BLOCK_SIZE, PrefixCache
from pd_runtime.sim import openai
from pd_runtime.sim.clock import ScaledClock
from pd_runtime.sim.config import EngineConfig
from pd_runtime.sim.connector import Connector, ConsumerJob, KvFaultSwitch, ProducerJob
from pd_runtime.sim.core import Emitted, EngineCore
from pd_runtime.sim.metrics import EngineMetrics
from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.scheduler import Scheduler, Sequence
from pd_runtime.sim.sidechannel import SideChannel, bind_host_for
from pd_runtime.sim.versions import ConnectorBehaviour

log = logging.getLogger(__name__)

Leg = Literal["plain", "producer", "consumer", "plain_waiting_for_kv", "plain_without_kv"]
RECORDS_KEPT = 10000


@dataclass
class RequestRecord:
    """Server-side timestamps of one request (Unix seconds), for measuring client timing error."""

    id: str
    x_request_id: str | None
    leg: Leg
    dp_rank: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    transfer_id: str | None = None
    kv_ready: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache (--sim-prefix-cache-blocks)."""
    finish_reason: str | None = None
    error: str | None = None
    kv_recomputed: bool = False
    """Its KV never loaded and decode computed the prompt itself (``kv_load_failure_policy: recompute``)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Output:
    index: int
    token_id: int
    text: str
    finish_reason: str | None
    context: int = 0
    """The context the token was decoded from (``openai.KvCache.context``): its logprob follows from it."""


def output_length(
    request: openai.GenerationRequest, profile: Profile, kv: openai.KvCache, eos_first: bool = False
) -> tuple[int, str]:
    """Tokens to generate and the finish reason. Without ignore_eos the output stops where the model ends it
    (``KvCache.eos_at``, drawn from each token's context, so P and D of one request agree and a continuation
    ends where the original would) with the calibrated profile's mean length, never at the first token, or
    at the first token with the ``eos_first`` fault knob. As in vLLM (MinTokensLogitsProcessor masks every
    stop token while fewer than ``min_tokens`` tokens are out), the earliest EOS is token ``min_tokens + 1``."""
    if request.ignore_eos or (profile.eos_mean_tokens <= 0 and not eos_first):
        return request.max_tokens, "length"
    if eos_first:
        eos = request.min_tokens + 1
        return (eos, "stop") if eos <= request.max_tokens else (request.max_tokens, "length")
    for index in range(max(2, request.min_tokens + 1), request.max_tokens + 1):
        if kv.eos_at(index, profile.eos_mean_tokens):
            return index, "stop"
    return request.max_tokens, "length"


class RequestHandle:
    def __init__(
        self,
        engine: SimEngine,
        core: EngineCore,
        seq: Sequence,
        record: RequestRecord,
        finish: str,
        kv: openai.KvCache,
        stopped: openai.Stopped | None = None,
    ) -> None:
        self._engine = engine
        self.core = core
        self.seq = seq
        self.record = record
        self._finish = finish
        self.kv = kv
        """The KV the sequence decodes from: its tokens follow from it."""
        self._texts = stopped.texts if stopped is not None else None
        """The tokens' texts when a stop string or stop token cut them (openai.stopped_output)."""
        self.stop_reason = stopped.reason if stopped is not None and stopped.finish == finish else None
        self._fetch: asyncio.Task[None] | None = None
        self._fetch_job: tuple[Connector, ConsumerJob] | None = None
        self._sink = core.submit(seq, self._start_fetch if seq.remote else None)
        self.kv_transfer_params: dict[str, Any] | None = None
        self.kv_load_failed = False
        """Its KV never loaded (a failed transfer): vLLM fails such a request."""
        self.producer_job: ProducerJob | None = None
        self._done = False
        self._closed = False
        self.opened_at = engine.clock.now()
        self.ready_at: float | None = None

    def fetch_kv(self, connector: Connector, job: ConsumerJob) -> None:
        """Fetch the KV once the scheduler allocates the sequence's blocks (vLLM's decode engine sends
        its block list to prefill only then)."""
        self._fetch_job = (connector, job)

    def _start_fetch(self) -> None:
        if self._fetch_job is None:
            return
        connector, job = self._fetch_job

        async def fetch() -> None:
            try:
                corrupt = await connector.consume(job)
            except Exception as exc:
                log.warning("request %s: KV handoff %s failed: %s", self.record.id, job.transfer_id, exc)
                if connector.config.load_failure_policy == "recompute":
                    # vLLM's scheduler sets num_computed_tokens to 0 and schedules the prompt here
                    self.record.kv_recomputed = True
                    self.ready_at = self._engine.clock.now()
                    self.core.recompute(self.seq)
                    return
                # "fail", the default: finish reason "error", which vLLM's API server answers as a 500
                # "Internal server error" (generate/base/serving.py)
                self.kv_load_failed = True
                self._sink.put_nowait("Internal server error")
                return
            if corrupt:
                self.kv = replace(self.kv, corrupt=True)
            self.record.kv_ready = time.time()
            self.ready_at = self._engine.clock.now()
            self.core.landed(self.seq)

        self._fetch = asyncio.create_task(fetch())

    async def _next(self) -> Emitted:
        item = await self._sink.get()
        if isinstance(item, str):
            raise openai.RequestError(500, item, err_type="InternalServerError")
        return item

    async def outputs(self) -> AsyncIterator[Output]:
        try:
            while True:
                emitted = await self._next()
                now, previous = time.time(), self.record.last_token
                if self.record.first_token is None:
                    self.record.first_token = now
                self.record.last_token = now
                self.record.completion_tokens = emitted.index
                self._engine.observe_token(self.record, now, previous)
                token = self.kv.token_id(emitted.index)
                text = openai.token_text(token) if self._texts is None else self._texts[emitted.index - 1]
                if emitted.finished:
                    self.record.finish_reason = self._finish
                    self._done = True
                    self._engine.finished(self, emitted)
                    yield Output(emitted.index, token, text, self._finish, self.kv.context(emitted.index))
                    return
                yield Output(emitted.index, token, text, None, self.kv.context(emitted.index))
        finally:
            self.close()

    def close(self) -> None:
        """Free the sequence; a request abandoned before its last token is aborted. A read in flight
        runs to its end and releases prefill's blocks (vLLM's read-mode decode notifies prefill of an
        aborted request too), one not started yet releases them at once where the version does
        (``unallocated_read_releases``); a write-mode wait for KV ends with the request. Once only: the
        server closes a handle whose outputs were never read too (its client left before the first)."""
        if self._closed:
            return
        self._closed = True
        read_mode = self._fetch_job is not None and self._fetch_job[0].config.read_mode
        if self._fetch is not None and not read_mode:
            self._fetch.cancel()
        if self._fetch is None and self._fetch_job is not None and not self._done:
            connector, job = self._fetch_job
            if connector.behaviour.unallocated_read_releases:
                self._engine.spawn(connector.release(job))
        self.core.release(self.seq)
        if not self._done and self.record.error is None:
            self.record.error = "aborted"


class SimEngine:
    def __init__(self, config: EngineConfig, profile: Profile) -> None:
        self.config = config
        self.profile = profile
        self.clock = ScaledClock(config.time_scale)
        self.metrics = EngineMetrics(config.served_model_names[0], config.dp if config.moriio_metrics else 0)
        read_mode = config.connector is not None and config.connector.read_mode
        self.behaviour = ConnectorBehaviour.of(config.vllm_version, read_mode)
        self.cores = [
            EngineCore(
                rank,
                profile,
                config.tp,
                Scheduler(
                    config.max_num_batched_tokens,
                    config.max_num_seqs,
                    config.chunked_prefill,
                    kv_blocks=config.kv_blocks,
                    preempted_remote_stalls=self.behaviour.preempted_remote_stalls,
                    aborted_remote_keeps_blocks=self.behaviour.aborted_kv_wait_keeps_blocks,
                ),
                self.clock,
                self.metrics,
            )
            for rank in range(config.dp)
        ]
        for rank in range(config.dp):
            self.metrics.prompt_sources(rank)
        self.metrics.waiting_for_kv.set_function(lambda: sum(core.waiting_for_kv for core in self.cores))
        self.connector = (
            Connector(
                config.connector,
                config.tp,
                profile,
                self.clock,
                self.metrics,
                KvFaultSwitch(config.faults.kv_fault_file, config.faults.kv_transfer_log),
                self.behaviour,
            )
            if config.connector
            else None
        )
        self.records: deque[RequestRecord] = deque(maxlen=RECORDS_KEPT)
        self.finished_count = 0
        blocks = config.prefix_cache_blocks
        self.prefix_caches = [PrefixCache(blocks) for _ in self.cores] if blocks else None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._next_block = 0
        self.stopping = asyncio.Event()
        """Set when shutdown begins: hung handlers (the unresponsive knob) let go so the server can close."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(core.run()) for core in self.cores]
        if self.connector is not None:
            cfg = self.connector.config
            side = SideChannel(
                bind_host_for(cfg.host_ip),
                cfg.handshake_port,
                cfg.notify_port,
                range(self.config.dp + self.config.tp - 1),
                engine_id=f"{cfg.host_ip}:{cfg.handshake_port}",
                metrics=self.metrics,
                on_notify=self.connector.on_notify,
                drop_fraction=self.config.faults.drop_notify,
                handshake_timeout_s=self.clock.wall(cfg.transfer_timeout_s),
            )
            side.start()
            self.connector.side = side
            self._tasks.append(asyncio.create_task(self._sweep(self.connector)))

    async def stop(self) -> None:
        self.stopping.set()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.connector is not None and self.connector.side is not None:
            await self.connector.side.close()

    async def _sweep(self, connector: Connector) -> None:
        while True:
            await asyncio.sleep(5.0)
            dropped = connector.sweep()
            if dropped:
                log.info("dropped %d unclaimed notify mailboxes older than defer_timeout", dropped)

    # -- requests -----------------------------------------------------------------------------------

    def _pick_core(self, dp_rank: int | None) -> EngineCore:
        if dp_rank is not None:
            if not 0 <= dp_rank < len(self.cores):
                raise openai.RequestError(400, f"data_parallel_rank {dp_rank} out of range")
            return self.cores[dp_rank]
        return min(self.cores, key=lambda core: core.load)

    def _block_ids(self, tokens: int) -> list[int]:
        count = max(1, math.ceil(tokens / BLOCK_SIZE))
        start, self._next_block = self._next_block, (self._next_block + count) % 1_000_000
        return [start + i for i in range(count)]

    def open(self, request: openai.GenerationRequest, x_request_id: str | None, dp_rank: int | None) -> RequestHandle:
        """Admit a request (raising RequestError for what vLLM would refuse) and start it."""
        core = self._pick_core(dp_rank)
        xid = x_request_id or uuid.uuid4().hex
        suffix = secrets.token_hex(4) if self.config.request_id_suffix else ""
        rid = openai.response_id(request.chat, xid, suffix)
        leg = self._leg(request)
        params = request.kv_transfer_params or {}
        kv = self._kv(request, leg)
        stopped = openai.stopped_output(
            request, kv, *output_length(request, self.profile, kv, self.config.faults.eos_first_token)
        )
        length, finish = stopped.length, stopped.finish
        transfer_id: str | None = None
        if leg in ("producer", "consumer"):
            transfer_id = self._transfer_id(params, rid)
        if leg == "producer":
            length, finish = self._producer_output(finish, length)
        record = RequestRecord(
            rid, x_request_id, leg, core.rank, request.prompt_tokens, request.max_tokens, time.time(), transfer_id
        )
        consumer_job = (
            self._consumer_job(params, xid, rid, request, core.rank, transfer_id) if leg == "consumer" else None
        )
        producer_peer = self._producer_peer(params, xid) if leg == "producer" else None
        remote = leg in ("consumer", "plain_waiting_for_kv")
        seq = Sequence(rid, request.prompt_tokens, length, ready=not remote, remote=remote)
        if leg == "plain_without_kv":
            seq.computed = request.prompt_tokens - 1  # claims the prompt's KV as loaded; it never was
            self.metrics.decoded_without_kv.inc()
        elif not remote:
            record.cached_tokens = seq.computed = self._cached_prefix(core.rank, request)
        handle = RequestHandle(self, core, seq, record, finish, kv, stopped)
        self.records.append(record)
        if consumer_job is not None and self.connector is not None:
            handle.fetch_kv(self.connector, consumer_job)
        if leg == "producer" and transfer_id is not None and finish == "length":
            handle.producer_job = ProducerJob(
                transfer_id=transfer_id,
                blocks=math.ceil(request.prompt_tokens / BLOCK_SIZE),
                prompt_tokens=request.prompt_tokens,
                prefill_started=0.0,
                prefill_ended=0.0,
                peer=producer_peer,
                peer_tp=_peer_tp(params, self.config.tp),
                peer_dp_size=_int_or(params.get("remote_dp_size"), 1),
            )
        return handle

    def _kv(self, request: openai.GenerationRequest, leg: Leg) -> openai.KvCache:
        """The prompt's KV as this leg holds it: computed here (plain, producer), received (consumer: the
        corrupt-kv fault spoils it), or claimed loaded but never received (decodes from garbage)."""
        corrupt = leg == "plain_without_kv" or (leg == "consumer" and self.config.faults.corrupt_kv)
        return openai.KvCache.of_prompt(request.prompt_ids, corrupt)

    def _cached_prefix(self, rank: int, request: openai.GenerationRequest) -> int:
        """--sim-prefix-cache-blocks: the prompt's tokens found in the rank's prefix cache (its last token is
        always computed); its blocks are cached from now on (a little early: vLLM caches a block once it
        has been computed, so a concurrent twin may hit here where vLLM would compute it)."""
        if self.prefix_caches is None:
            return 0
        cache = self.prefix_caches[rank]
        cached = min(cache.lookup(request.prompt_blocks) * BLOCK_SIZE, request.prompt_tokens - 1)
        cache.store(request.prompt_blocks)
        self.metrics.prefix_cache_queries.inc(request.prompt_tokens)
        self.metrics.prefix_cache_hits.inc(cached)
        return cached

    def _leg(self, request: openai.GenerationRequest) -> Leg:
        params = request.kv_transfer_params or {}
        if self.connector is None:
            return "plain"
        if self.connector.config.role == "P" and params.get("do_remote_decode") is True:
            return "producer"
        if self.connector.config.role == "D":
            if params.get("do_remote_prefill") is True:
                return "consumer"
            if self.behaviour.plain_decode_waits_for_kv:
                log.warning("request without do_remote_prefill on a decode engine: waits for KV (vLLM < 0.32)")
                return "plain_waiting_for_kv"
            if self.behaviour.plain_decode_skips_prefill:
                log.warning("request without do_remote_prefill on a decode engine: decoded without KV (vLLM < 0.33)")
                return "plain_without_kv"
        return "plain"

    def _transfer_id(self, params: dict[str, Any], rid: str) -> str:
        tid = params.get("transfer_id")
        if isinstance(tid, str) and tid:
            return tid
        if self.config.require_transfer_id:
            # G2 engines before 0.31 read params["transfer_id"] in the scheduler: a KeyError
            # (docs/protocol.md#request-ids).
            raise openai.RequestError(
                500, "kv_transfer_params lacks transfer_id", "kv_transfer_params", "InternalServerError"
            )
        return f"sidecar-{rid}"

    def _producer_output(self, finish: str, length: int) -> tuple[int, str]:
        """One token: the request stops there when its EOS falls on it, else it is length-capped (KV kept)."""
        faults = self.config.faults
        if faults.prefill_error:
            err_type = "InternalServerError" if faults.prefill_error >= 500 else "BadRequestError"
            raise openai.RequestError(faults.prefill_error, "simulated prefill failure (fault knob)", None, err_type)
        return 1, ("stop" if finish == "stop" and length == 1 else "length")

    def _producer_peer(self, params: dict[str, Any], xid: str) -> protocol.PeerAddress | None:
        assert self.connector is not None
        peer = _peer(params, xid, "P")
        if peer is None and not self.connector.config.read_mode:
            raise openai.RequestError(
                400,
                "cannot find the decode engine: X-Request-Id has no ___decode_addr_ part and kv_transfer_params "
                "lacks remote_host/remote_handshake_port/remote_notify_port",
                "kv_transfer_params",
            )
        return peer

    def _consumer_job(
        self,
        params: dict[str, Any],
        xid: str,
        rid: str,
        request: openai.GenerationRequest,
        dp_rank: int,
        transfer_id: str | None,
    ) -> ConsumerJob:
        assert self.connector is not None and transfer_id is not None
        peer = _peer(params, xid, "D")
        if peer is None:
            raise openai.RequestError(
                400,
                "cannot find the prefill engine: X-Request-Id has no ___prefill_addr_ part and kv_transfer_params "
                "lacks remote_host/remote_handshake_port/remote_notify_port",
                "kv_transfer_params",
            )
        if self.connector.config.read_mode:
            blocks = params.get("remote_block_ids")
            if not isinstance(blocks, list) or not blocks or not params.get("remote_engine_id"):
                raise openai.RequestError(
                    400,
                    "read mode needs remote_engine_id and remote_block_ids from the prefill response",
                    "kv_transfer_params",
                )
        return ConsumerJob(
            transfer_id=transfer_id,
            req_id=rid,
            prompt_tokens=request.prompt_tokens,
            block_ids=self._block_ids(request.prompt_tokens + request.max_tokens),
            dp_rank=dp_rank,
            peer=peer,
            peer_tp=_peer_tp(params, self.config.tp),
            peer_dp_rank=_int_or(params.get("remote_dp_rank"), 0),
        )

    # -- completion bookkeeping ------------------------------------------------------------------------

    def observe_token(self, record: RequestRecord, now: float, previous: float | None) -> None:
        if previous is None:
            self.metrics.ttft.observe(now - record.arrival)
        else:
            self.metrics.itl.observe(now - previous)
        self.metrics.generation_tokens.inc()

    def finished(self, handle: RequestHandle, emitted: Emitted) -> None:
        record = handle.record
        self.metrics.prompt_tokens.inc(record.prompt_tokens)
        self.metrics.prompt_sources(record.dp_rank, **self._prompt_sources(record))
        self.metrics.success(record.finish_reason or "length")
        if record.first_token is not None and record.last_token is not None:
            self.metrics.e2e.observe(record.last_token - record.arrival)
            if record.completion_tokens > 1:
                self.metrics.tpot.observe((record.last_token - record.first_token) / (record.completion_tokens - 1))
        started = handle.core.first_scheduled.get(id(handle.seq))
        if started is not None:
            ready = handle.ready_at if handle.ready_at is not None else handle.opened_at
            self.metrics.queue.observe(self.clock.wall(max(0.0, started - ready)))
        self._finish_producer(handle, emitted)
        self.finished_count += 1
        crash_after = self.config.faults.crash_after
        if crash_after and self.finished_count >= crash_after:
            log.error("fault knob: crashing after %d finished requests", self.finished_count)
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)

    def _prompt_sources(self, record: RequestRecord) -> dict[str, int]:
        """Where a finished request's prompt KV came from, as vLLM 0.31 counts it: a write-mode decode
        request got every prompt token by KV transfer, a read-mode one all but the last, which it computes
        itself (``MoRIIOConnectorScheduler.get_num_new_matched_tokens``: ``prompt - 1``; also for a plain
        request it claims loaded on a read-mode decode engine of vLLM < 0.33); every other request
        computed its prompt, but for what its prefix cache held (``local_cache_hit``, with
        --sim-prefix-cache-blocks; else 0)."""
        prompt = record.prompt_tokens
        read_mode = self.connector is not None and self.connector.config.read_mode
        if record.kv_recomputed:
            return {"local_compute": prompt}
        if record.leg == "plain_without_kv" or (record.leg == "consumer" and read_mode):
            return {"external_kv_transfer": prompt - 1, "local_compute": 1}
        if record.leg in ("consumer", "plain_waiting_for_kv"):
            return {"external_kv_transfer": prompt}
        return {"local_compute": prompt - record.cached_tokens, "local_cache_hit": record.cached_tokens}

    def _finish_producer(self, handle: RequestHandle, emitted: Emitted) -> None:
        job = handle.producer_job
        if job is None or self.connector is None:
            return
        cfg = self.connector.config
        started = handle.core.first_scheduled.get(id(handle.seq), emitted.model_time)
        job = replace(job, prefill_started=started, prefill_ended=emitted.model_time, rank=handle.core.rank)
        blocks = self._block_ids(handle.record.prompt_tokens)
        handle.kv_transfer_params = protocol.producer_response_params(
            cfg.host_ip, cfg.handshake_port, cfg.notify_port, blocks, self.config.dp, self.config.tp, job.transfer_id
        )
        reap_step = handle.core.next_connector_output if self.config.reap_waits_for_a_forward_step else None
        self.spawn(self._produce(self.connector, handle.core, job, reap_step))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run work that outlives its request (a hand-off, a release) until it ends or the engine stops."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _produce(
        connector: Connector, core: EngineCore, job: ProducerJob, reap_step: Callable[[], Awaitable[None]] | None
    ) -> None:
        """The producer's hand-off; its blocks stay in the engine core's KV cache until it ends, as vLLM's
        delay-freed blocks do (they count in ``vllm:kv_cache_usage_perc`` and take capacity). Their free is
        the step's KV connector output (``finished_sending``), which reaps the core's expired sends too."""
        core.hold_blocks(job.blocks)
        try:
            await connector.produce(job, reap_step)
        finally:
            core.hold_blocks(-job.blocks)
            core.connector_output()


def _peer(params: dict[str, Any], xid: str, own_role: protocol.Role) -> protocol.PeerAddress | None:
    """docs/protocol.md#request-ids (newest order): the X-Request-Id first, then the explicit keys."""
    try:
        peer = protocol.peer_from_request_id(xid, own_role)
    except protocol.ProtocolError as exc:
        raise openai.RequestError(400, f"X-Request-Id: {exc}") from None
    if peer is not None:
        return peer
    try:
        return protocol.peer_from_params(params)
    except protocol.ProtocolError as exc:
        raise openai.RequestError(400, f"kv_transfer_params: {exc}", "kv_transfer_params") from None


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _peer_tp(params: dict[str, Any], own_tp: int) -> int:
    """The peer's TP size: remote_tp_size, then tp_size (docs/protocol.md#prefill-leg-params), else ours."""
    for key in ("remote_tp_size", "tp_size"):
        value = _int_or(params.get(key), 0)
        if value > 0:
            return value
    return own_tp
