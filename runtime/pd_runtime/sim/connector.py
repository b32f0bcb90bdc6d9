"""The simulated MoRIIOConnector: KV handoffs between a producer (P) and a consumer (D) engine.

Every handoff really crosses the ZMQ side channels with the messages of docs/protocol.md#notify-messages; only
the RDMA data movement is replaced by waiting the modelled transfer time. Write mode
(docs/protocol.md#write-mode): D sends ``remote_blocks`` to P's notify ports and waits; P, once its prefill is
done and D's blocks are known, "writes" and sends ``write_done``; then both free. Read mode
(docs/protocol.md#read-mode): D handshakes with P, "reads", and sends ``release`` so P frees its held blocks.
Held producer blocks are reaped after ``defer_timeout`` (G2 behaviour): in write mode at once, in read
mode at the engine's next step with KV connector output, which an idle engine with vLLM's ``uni``
executor only reaches when a request comes (docs/vllm-versions.md#deferred-send-reaping).

A fault switch (``--sim-kv-fault-file``, the live tier's ``mori.io`` stand-in's format) is read at every
transfer by the side that starts it, P in write mode and D in read mode: ``delay`` completes it
``seconds`` later, ``fail`` fails it (write mode: P logs it and D is never told, as vLLM 0.31's writer
thread does; read mode: the D request fails and D still sends ``release``), ``drop`` never completes it
(write: P gives up after ``transfer_timeout``, D waits on; read: D waits until the request is aborted),
and ``corrupt`` completes it with wrong bytes (D, whose KV it is, reads the switch when its KV lands).

The version's behaviours (sim/versions.py): from vLLM 0.33 a write-mode P that gives up waiting for D's
block list tells D (``write_failed``), and D's wait raises ``KvLoadFailed`` (kept for a request D has not
allocated yet, as vLLM keeps up to 4096 unmatched failures); from 0.33 P writes between different TP
sizes (``protocol.write_targets``), before it a mixed-TP write never reaches D.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_runtime import protocol
from pd_runtime.sim.clock import ScaledClock
from pd_runtime.sim.config import ConnectorConfig
from pd_runtime.sim.metrics import EngineMetrics
from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.sidechannel import SideChannel
from pd_runtime.sim.timing import kv_transfer_time, write_tail_time
from pd_runtime.sim.versions import ConnectorBehaviour

log = logging.getLogger(__name__)
UNMATCHED_FAILURES_KEPT = 4096
"""vLLM 0.33's ``_MAX_UNMATCHED_WRITE_FAILURES``: write_failed notices kept for requests not allocated yet."""


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Return when the first of ``waits`` does; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class KvLoadFailed(RuntimeError):
    """Prefill told decode that this request's KV will never come (``write_failed``, vLLM 0.33 on)."""


@dataclass
class _Mailbox:
    """Notifies for one transfer id; they may arrive before the request they belong to."""

    created: float
    count: int = 0
    first_at: float | None = None
    decode_rank: int = 0
    claimed: bool = False
    failed: bool = False
    """A ``write_failed`` notice arrived: the KV will never come."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class ProducerJob:
    transfer_id: str
    blocks: int
    prompt_tokens: int
    prefill_started: float
    prefill_ended: float
    peer: protocol.PeerAddress | None
    peer_tp: int
    peer_dp_size: int = 1
    rank: int = 0  # the engine core (DP rank) that prefilled it


@dataclass(frozen=True)
class ConsumerJob:
    transfer_id: str
    req_id: str
    prompt_tokens: int
    block_ids: list[int]
    dp_rank: int
    peer: protocol.PeerAddress
    peer_tp: int
    peer_dp_rank: int


@dataclass(frozen=True)
class KvFaultSwitch:
    """The fault switch file and the transfer log (both optional: empty path, no fault, no log)."""

    switch: str = ""
    transfer_log: str = ""

    def read(self) -> dict[str, Any]:
        if not self.switch:
            return {}
        try:
            value = json.loads(Path(self.switch).read_text() or "{}")
        except (OSError, ValueError) as exc:
            log.warning("KV fault switch %s unreadable (%s): no fault", self.switch, exc)
            return {}
        return value if isinstance(value, dict) else {}

    def start(self, op: str, transfer_id: str) -> dict[str, Any]:
        """The switch as this transfer sees it, recorded in the transfer log."""
        switch = self.read()
        if self.transfer_log:
            line = json.dumps({"op": op, "transfer_id": transfer_id, "fault": switch.get("fault")})
            with open(self.transfer_log, "a") as out:
                out.write(line + "\n")
        return switch


class Connector:
    def __init__(
        self,
        config: ConnectorConfig,
        tp: int,
        profile: Profile,
        clock: ScaledClock,
        metrics: EngineMetrics,
        faults: KvFaultSwitch | None = None,
        behaviour: ConnectorBehaviour | None = None,
    ) -> None:
        self.config = config
        self.faults = faults or KvFaultSwitch()
        self.behaviour = behaviour or ConnectorBehaviour.of(read_mode=config.read_mode)
        self._tp = tp
        self._profile = profile
        self._clock = clock
        self._metrics = metrics
        self._mail: dict[str, _Mailbox] = {}
        self.side: SideChannel | None = None

    # -- incoming notifies ------------------------------------------------------------------------

    def on_notify(self, message: dict[str, Any] | str) -> None:
        """Record a notify; a raw string is a G1/G1b completion (write_done on D, release on P)."""
        if isinstance(message, str):
            self._post(message, 0)
            return
        if message["type"] == "write_failed":
            box = self._box(message["transfer_id"])
            box.failed = True
            box.changed.set()
            return
        self._post(message["transfer_id"], int(message.get("decode_rank", 0) or 0))

    def _box(self, transfer_id: str) -> _Mailbox:
        box = self._mail.get(transfer_id)
        if box is None:
            box = self._mail[transfer_id] = _Mailbox(created=self._clock.now())
        return box

    def _post(self, transfer_id: str, decode_rank: int) -> None:
        box = self._box(transfer_id)
        box.count += 1
        box.decode_rank = decode_rank
        if box.first_at is None:
            box.first_at = self._clock.now()
        box.changed.set()

    async def _await_count(self, transfer_id: str, count: int, timeout_model_s: float | None) -> _Mailbox:
        box = self._box(transfer_id)
        box.claimed = True

        async def wait() -> None:
            while box.count < count:
                if box.failed:
                    raise KvLoadFailed(f"prefill gave up waiting for the block list of transfer {transfer_id}")
                box.changed.clear()
                await box.changed.wait()

        if timeout_model_s is None:
            await wait()
        else:
            await asyncio.wait_for(wait(), self._clock.wall(timeout_model_s))
        return box

    def sweep(self) -> int:
        """Drop mailboxes nobody claimed within the defer timeout (stale or unknown transfers), but for
        failure notices of requests not allocated yet, of which the newest ``UNMATCHED_FAILURES_KEPT`` stay."""
        horizon = self._clock.now() - self.config.defer_timeout_s
        unclaimed = [(tid, box) for tid, box in self._mail.items() if not box.claimed]
        failures = [tid for tid, box in unclaimed if box.failed]
        stale = [tid for tid, box in unclaimed if box.created < horizon and not box.failed]
        stale += failures[: max(0, len(failures) - UNMATCHED_FAILURES_KEPT)]
        for tid in stale:
            del self._mail[tid]
        return len(stale)

    def _rank_ports(self, base: int, dp_rank: int, ranks: int) -> list[int]:
        return [protocol.side_channel_port(base, dp_rank, r) for r in range(ranks)]

    def _require_side(self) -> SideChannel:
        if self.side is None:
            raise RuntimeError("connector used before its side channel started")
        return self.side

    # -- producer -----------------------------------------------------------------------------------

    async def produce(self, job: ProducerJob, reap_step: Callable[[], Awaitable[None]] | None = None) -> None:
        """Hold the request's blocks until the handoff completes or, past ``defer_timeout``, they are reaped:
        in write mode at once (prefill's writer thread gives up and acknowledges the free), in read mode at
        the engine's next step with KV connector output, ``reap_step`` (None: at once)."""
        self._metrics.blocks_held.inc(job.blocks)
        try:
            if self.config.read_mode:
                await self._await_release(job, reap_step)
            else:
                await self._write(job)
            self._metrics.transfers.labels("completed").inc()
        except TimeoutError:
            self._metrics.transfers.labels("expired").inc()
            self._metrics.moriio_kv_expired(job.rank)
            log.warning(
                "transfer %s: no %s within defer_timeout %.0f s, blocks freed",
                job.transfer_id,
                "release" if self.config.read_mode else "remote_blocks",
                self.config.defer_timeout_s,
            )
        except Exception:
            self._metrics.transfers.labels("failed").inc()
            self._metrics.moriio_failed_transfer(job.rank)
            log.exception("transfer %s failed", job.transfer_id)
        finally:
            self._metrics.blocks_held.dec(job.blocks)
            self._mail.pop(job.transfer_id, None)

    async def _await_release(self, job: ProducerJob, reap_step: Callable[[], Awaitable[None]] | None) -> None:
        """Wait for decode's release; past ``defer_timeout`` the send has expired, and vLLM's scheduler reaps
        it in its next ``update_connector_output`` (docs/vllm-versions.md#deferred-send-reaping), where a
        late release also ends up: either way it counts as expired (TimeoutError)."""
        releases = min(self._tp, job.peer_tp)
        try:
            await self._await_count(job.transfer_id, releases, self.config.defer_timeout_s)
        except TimeoutError:
            if reap_step is not None:
                await _first_of(reap_step(), self._await_count(job.transfer_id, releases, None))
            raise

    def _write_targets(self, prefill_tp: int, decode_tp: int) -> list[tuple[int, int]]:
        """(decode rank, writers) of every write_done a transfer between these TP sizes sends, over all
        prefill ranks; empty when the version cannot write between them (mixed TP before vLLM 0.33, or
        neither TP size a multiple of the other)."""
        if prefill_tp != decode_tp and not self.behaviour.mixed_tp_write:
            return []
        heads = self._profile.kv_heads or max(prefill_tp, decode_tp)  # a profile without KV geometry: split heads
        try:
            return [t for r in range(prefill_tp) for t in protocol.write_targets(r, prefill_tp, decode_tp, heads)]
        except ValueError:
            return []

    async def _write(self, job: ProducerJob) -> None:
        if job.peer is None:
            raise RuntimeError("write mode needs the decode engine's address")
        side = self._require_side()
        try:
            box = await self._await_count(job.transfer_id, 1, self.config.defer_timeout_s)
        except TimeoutError:
            if self.behaviour.write_failed_notice:
                await self._notify_write_failed(side, job)
            raise
        targets = self._write_targets(self._tp, job.peer_tp)
        if not targets:
            raise RuntimeError(
                f"vLLM {self.behaviour.release.name} writes no KV from TP {self._tp} to TP {job.peer_tp}"
            )
        ranks = sorted({rank for rank, _ in targets})
        handshake = [protocol.side_channel_port(job.peer.handshake_port, box.decode_rank, r) for r in ranks]
        await side.handshake(job.peer.host, handshake)
        arrived = box.first_at if box.first_at is not None else self._clock.now()
        prefill = job.prefill_ended - job.prefill_started
        done = max(
            job.prefill_ended + write_tail_time(self._profile, job.prompt_tokens, prefill),
            arrived + kv_transfer_time(self._profile, job.prompt_tokens),
        )
        await self._clock.sleep_until(done)
        await self._apply_fault(self.faults.start("write", job.transfer_id))
        for rank, writers in targets:
            port = protocol.side_channel_port(job.peer.notify_port, box.decode_rank, rank)
            frame = protocol.write_done_message(job.transfer_id, writers)
            await side.notify(job.peer.host, [port], frame, "write_done")
        self._record_transfer(job.rank, job.prompt_tokens, job.blocks)
        log.debug("transfer %s written to %s", job.transfer_id, job.peer.host)

    async def _notify_write_failed(self, side: SideChannel, job: ProducerJob) -> None:
        """vLLM 0.33's ``_notify_write_failed``: decode's DP rank is unknown (no block list came), so every
        rank of every DP rank is told."""
        assert job.peer is not None
        ports = [
            protocol.side_channel_port(job.peer.notify_port, dp, rank)
            for dp in range(max(job.peer_dp_size, 1))
            for rank in range(job.peer_tp)
        ]
        failed = protocol.write_failed_message(job.transfer_id)
        await side.notify(job.peer.host, sorted(set(ports)), failed, "write_failed")

    # -- consumer -----------------------------------------------------------------------------------

    async def _apply_fault(self, switch: dict[str, Any]) -> None:
        """What the side starting a transfer does with the fault switch (the module's docstring)."""
        fault = switch.get("fault")
        if fault == "delay":
            await asyncio.sleep(float(switch.get("seconds", 0)))
        elif fault == "fail":
            raise RuntimeError("KV transfer failed (fault switch)")
        elif fault == "drop":
            if self.config.read_mode:
                await asyncio.Event().wait()  # never completes; the request's abort cancels it
            await self._clock.sleep_until(self._clock.now() + self.config.transfer_timeout_s)
            raise TimeoutError("KV transfer never completed (fault switch)")

    async def consume(self, job: ConsumerJob) -> bool:
        """Return once the request's KV is in place (write: write_done arrived; read: read + release):
        whether it arrived corrupted (the fault switch)."""
        side = self._require_side()
        peer_ranks = min(self._tp, job.peer_tp)
        if self.config.read_mode:
            handshake = self._rank_ports(job.peer.handshake_port, job.peer_dp_rank, peer_ranks)
            await side.handshake(job.peer.host, handshake)
            switch = self.faults.start("read", job.transfer_id)
            try:
                await self._apply_fault(switch)
            except RuntimeError:
                # vLLM's decode tells prefill to free its blocks after a failed read too (``_pop_done_transfers``,
                # "Notifying prefill to free blocks", 0.31 to 0.34); only a read that never ends leaves them to
                # prefill's defer_timeout
                self._metrics.moriio_failed_transfer(job.dp_rank)
                await self.release(job)
                raise
            await self._clock.sleep_until(self._clock.now() + kv_transfer_time(self._profile, job.prompt_tokens))
            self._record_transfer(job.dp_rank, job.prompt_tokens, len(job.block_ids))
            await self.release(job)
        else:
            writes = len(self._write_targets(job.peer_tp, self._tp)) or peer_ranks
            waiting = asyncio.ensure_future(self._await_count(job.transfer_id, writes, None))
            try:
                message = protocol.remote_blocks_message(job.req_id, job.transfer_id, job.block_ids, job.dp_rank)
                ports = self._rank_ports(job.peer.notify_port, job.peer_dp_rank, self._tp)
                await side.notify(job.peer.host, ports, message, "remote_blocks")
                await waiting
            finally:
                waiting.cancel()
                self._mail.pop(job.transfer_id, None)
            switch = self.faults.read()
        self._metrics.transfers.labels("completed").inc()
        return switch.get("fault") == "corrupt"

    def _record_transfer(self, rank: int, tokens: int, blocks: int) -> None:
        """vLLM main's transfer metrics of one transfer, on the side that moves the KV (write: P, read: D):
        its modelled duration in wall seconds, its KV bytes, one descriptor per block."""
        seconds = self._clock.wall(kv_transfer_time(self._profile, tokens))
        self._metrics.moriio_transfer(rank, seconds, tokens * self._profile.kv_bytes_per_token, blocks)

    async def release(self, job: ConsumerJob) -> None:
        """Read mode: tell prefill it may free the request's blocks (read, or aborted before allocation)."""
        ports = self._rank_ports(job.peer.notify_port, job.peer_dp_rank, self._tp)
        message = protocol.release_message(job.transfer_id, self._tp)
        await self._require_side().notify(job.peer.host, ports, message, "release")
