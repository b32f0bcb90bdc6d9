"""One engine core (one DP rank): the pure scheduler driven on a scaled real clock.

Steps run back to back while there is work, each lasting what ``timing.step_time`` says; tokens are
handed to each request's queue when its step ends, which is when a real engine would emit them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pd_runtime.sim.clock import ScaledClock
from pd_runtime.sim.metrics import EngineMetrics
from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.scheduler import Scheduler, Sequence
from pd_runtime.sim.timing import step_time

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Emitted:
    index: int
    finished: bool
    model_time: float


class EngineCore:
    def __init__(
        self, rank: int, profile: Profile, tp: int, scheduler: Scheduler, clock: ScaledClock, metrics: EngineMetrics
    ) -> None:
        self.rank = rank
        self._profile = profile
        self._tp = tp
        self._scheduler = scheduler
        self._clock = clock
        self._metrics = metrics
        self._gauge = metrics.scheduler_gauges(rank)
        self._wake = asyncio.Event()
        self._sinks: dict[int, asyncio.Queue[Emitted | str]] = {}
        self._on_allocated: dict[int, Callable[[], None]] = {}
        self.first_scheduled: dict[int, float] = {}
        self._connector_output_waiters: list[asyncio.Future[None]] = []
        self.dead: str | None = None
        """Why the core's loop ended (vLLM's EngineDeadError); None while it runs."""

    @property
    def load(self) -> int:
        return len(self._scheduler.running) + len(self._scheduler.waiting)

    @property
    def waiting_for_kv(self) -> int:
        """Sequences in WAITING_FOR_REMOTE_KVS: a request waiting here no prefill will serve is a leak."""
        return sum(1 for seq in self._scheduler.waiting if not seq.ready)

    def submit(self, seq: Sequence, on_allocated: Callable[[], None] | None = None) -> asyncio.Queue[Emitted | str]:
        """Queue a sequence; its tokens (or, put there by others, an error message) arrive in the sink.
        ``on_allocated`` runs when a remote-KV sequence gets its blocks (then decode asks for the KV)."""
        sink: asyncio.Queue[Emitted | str] = asyncio.Queue()
        if self.dead is not None:
            sink.put_nowait(self.dead)
            return sink
        self._sinks[id(seq)] = sink
        if on_allocated is not None:
            self._on_allocated[id(seq)] = on_allocated
        self._scheduler.add(seq)
        self._wake.set()
        return sink

    def landed(self, seq: Sequence) -> None:
        """Remote KV arrived for a waiting consumer sequence: it may now be scheduled."""
        if id(seq) in self._sinks:
            self._scheduler.remote_kv_landed(seq)
            self._wake.set()

    def recompute(self, seq: Sequence) -> None:
        """Its remote KV will never come: the sequence computes its whole prompt here."""
        if id(seq) in self._sinks:
            self._scheduler.remote_kv_failed(seq)
            self._wake.set()

    def hold_blocks(self, blocks: int) -> None:
        """Blocks a finished producer request keeps for its decode engine (negative: given back)."""
        self._scheduler.transfer_blocks += blocks
        self._wake.set()
        self._gauges()

    async def next_connector_output(self) -> None:
        """Return at the core's next step that hands vLLM's scheduler KV connector output: the end of a
        forward step, or a deferred send of this core freed (its ``finished_sending``)."""
        waiter = asyncio.get_running_loop().create_future()
        self._connector_output_waiters.append(waiter)
        await waiter

    def connector_output(self) -> None:
        """This step carries KV connector output: expired deferred sends are reaped now."""
        waiters, self._connector_output_waiters = self._connector_output_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def release(self, seq: Sequence) -> None:
        """Forget a sequence (finished, or aborted because its client went away)."""
        self._scheduler.abort(seq)
        self._sinks.pop(id(seq), None)
        self._on_allocated.pop(id(seq), None)
        self.first_scheduled.pop(id(seq), None)
        self._wake.set()  # its blocks and its slot are free now
        self._gauges()

    def _gauges(self) -> None:
        self._gauge.running.set(len(self._scheduler.running))
        self._gauge.waiting.set(len(self._scheduler.waiting))
        self._gauge.kv_usage.set(self._scheduler.kv_usage)

    def _admit(self) -> None:
        for seq in self._scheduler.preempt():
            self._metrics.preemptions.inc()
            log.info("rank %d preempted %s (stalls waiting for KV: %s)", self.rank, seq.seq_id, not seq.ready)
        for seq in list(self._scheduler.allocate_remote()):
            callback = self._on_allocated.pop(id(seq), None)
            if callback is not None:
                callback()

    async def run(self) -> None:
        """Step until cancelled; a step that raises ends the core as an engine-core crash ends vLLM's:
        every request in it fails, new ones fail at once and ``/health`` answers 503."""
        try:
            await self._steps()
        except Exception as exc:
            log.exception("rank %d: engine core died", self.rank)
            self.dead = f"engine core {self.rank} died: {exc!r}"
            for sink in self._sinks.values():
                sink.put_nowait(self.dead)

    async def _steps(self) -> None:
        deadline = self._clock.now()
        while True:
            self._admit()
            step = self._scheduler.plan()
            self._gauges()
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = self._clock.now()
                continue
            start = max(deadline, self._clock.now())
            for seq, _ in step.entries:
                self.first_scheduled.setdefault(id(seq), start)
            deadline = start + step_time(self._profile, self._tp, step.shape)
            await self._clock.sleep_until(deadline)
            for event in self._scheduler.commit(step):
                sink = self._sinks.get(id(event.seq))
                if sink is not None:
                    sink.put_nowait(Emitted(event.index, event.finished, deadline))
            self.connector_output()
