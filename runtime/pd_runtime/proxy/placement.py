"""Where a request runs: its prefill and decode instances and DP ranks, the wait for a decode slot, and
whether a failed leg may run again elsewhere (docs/proxy.md, "Routing", "Failover"), and whether it skips
prefill (``disaggregation``).

The policies are ``routing``'s (pure); this applies them to the registry's live instances at the time.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pd_runtime.protocol import new_request_uid
from pd_runtime.proxy.affinity import prefix_key
from pd_runtime.proxy.circuits import Circuits
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.disaggregation import DecodeCaches, decide, prompt_of
from pd_runtime.proxy.errors import ApiError, LegFailure, deadline_exceeded, no_instance, overloaded
from pd_runtime.proxy.legs import ClientRequest, Target, TransferIds
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Instance, InstanceRole, Registry
from pd_runtime.proxy.routing import Candidate, Router, Slot, decode_dp_rank
from pd_runtime.proxy.timer import RunningLoop

log = logging.getLogger(__name__)


class Placement:
    def __init__(
        self,
        config: ProxyConfig,
        registry: Registry,
        router: Router,
        circuits: Circuits,
        metrics: ProxyMetrics,
        loop: RunningLoop,
    ) -> None:
        self.config = config
        self.loop = loop
        self.registry = registry
        self.router = router
        self.circuits = circuits
        self.metrics = metrics
        self.decode_queue = 0
        """Requests waiting for a decode slot (``_decode_slot``)."""
        self.decode_caches = DecodeCaches(config.disaggregation_cache_tokens)
        self._slot_freed = asyncio.Event()

    async def place(
        self, request: ClientRequest, deadline: Deadline, selective: bool
    ) -> tuple[Target | None, Target, TransferIds]:
        """The request's prefill (None when colocated, or served on decode alone) and decode targets, and the
        ids that name them (docs/protocol.md#request-ids), by the request's deadline; a half-open instance
        chosen gets its trial (``breaker``). ``selective``: a client request, which ``--disaggregation`` may
        serve on decode alone (the canary is always disaggregated: it checks the transfer)."""
        if self.registry.mode == "colocated":
            return self._alone(self._pick("E", None, request, time.monotonic()))
        config = self.config
        prompt = prompt_of(request.body) if selective and config.disaggregation == "threshold" else None
        reason = decide(config.disaggregation, config.disaggregation_threshold, prompt)
        # One live set per role per request: the prefill set is checked before any wait for a decode slot
        # and routed from unless that wait ran (the registry may have changed meanwhile).
        now = time.monotonic()
        prefills: list[Instance] | None = None
        if reason == "disaggregated":
            prefills = self.registry.live("P", now)
            if not prefills:
                raise _no_live("P")  # before waiting for a decode slot
        decode_slot = self._pick_within("D", "D", config.decode_max_in_flight, now)
        if decode_slot is None:
            decode_slot = await self._decode_slot(deadline)
            prefills = None
        if prompt is not None:
            decode_key = decode_slot.instance.http_address
            if reason == "disaggregated":
                cached = self.decode_caches.cached_tokens(decode_key, prompt)
                reason = decide(config.disaggregation, config.disaggregation_threshold, prompt, cached)
            self.decode_caches.sent(decode_key, prompt)
        if selective:
            self.metrics.disaggregation_reasons[reason].inc()
        if reason != "disaggregated":
            return self._alone(decode_slot)
        return self._disaggregated(request, now, prefills, decode_slot)

    def _alone(self, engine: Target) -> tuple[None, Target, TransferIds]:
        """One plain request to one engine: colocated, or decode alone."""
        self.circuits.routed_to(engine)
        uid = new_request_uid()
        return None, engine, TransferIds(uid=uid, transfer_id="", request_id=uid)

    def _disaggregated(
        self, request: ClientRequest, now: float, prefills: list[Instance] | None, decode_slot: Target
    ) -> tuple[Target, Target, TransferIds]:
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
        self.circuits.routed_to(prefill, decode)
        return prefill, decode, TransferIds.mint(prefill.instance, decode.instance)

    def holding(self, prefill: Target | None, decode: Target | None) -> Holding:
        """``with``: the targets' slots count as busy for the router while the request runs on them; once
        they are free, requests waiting for a decode slot look again."""
        slots: list[Slot] = [(t.instance.http_address, t.dp_rank) for t in (prefill, decode) if t is not None]
        for slot in slots:
            self.router.acquire(slot)
        return Holding(self, slots)

    def _release(self, slots: list[Slot]) -> None:
        for slot in slots:
            self.router.release(slot)
        if self.decode_queue:  # requests waiting for a decode slot look again (none: no Event to renew)
            self._slot_freed.set()
            self._slot_freed = asyncio.Event()

    def fails_over(self, failed: Target, failure: LegFailure, transfer_id: str) -> bool:
        """Whether another live instance of the failed one's role exists to serve the request again (``leaves``)."""
        if not self.leaves(failed, failure, transfer_id, "failing over"):
            return False
        self.metrics.failovers.labels(failure.leg).inc()
        return True

    def leaves(self, failed: Target, failure: LegFailure, transfer_id: str, action: str) -> bool:
        """Whether another live instance of the failed one's role exists to take the request on (failed over,
        or migrated); the failed one's circuit breaker then opens (a timeout or repeated failures opened it
        already)."""
        now = time.monotonic()
        inst = self.circuits.instance(failed)
        if inst is None or not any(other.key != inst.key for other in self.registry.live(inst.role, now)):
            return False
        if (reason := inst.breaker.failed_over(now)) is not None:
            self.circuits.opened(failed, reason, failure)
        self.metrics.upstream_errors.labels(failure.leg, failure.kind).inc()
        log.warning(
            "%s role=%s http=%s after %s transfer_id=%s",
            action,
            inst.role,
            inst.key,
            failure,
            transfer_id,
            extra={"transfer_id": transfer_id},
        )
        return True

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
        return None if slot is None else Target(by_key[slot[0]].registration, slot[1])

    async def _decode_slot(self, deadline: Deadline) -> Target:
        """A decode DP rank with fewer than --decode-max-in-flight requests (its max_num_seqs).

        Past max_num_seqs vLLM queues a request without allocating its blocks, so in write mode its block
        list reaches prefill late, and after defer_timeout prefill drops the transfer. Waiting here instead
        starts neither leg: prefill's clock does not run. The wait is bounded by one more full batch per
        rank and by the first-byte timeout; past either the client gets 429 + Retry-After (overloaded), past
        the request's deadline first 504.
        """
        limit = self.config.decode_max_in_flight
        until = deadline.bound(self.loop.time() + self.config.timeouts.first_byte)
        while (target := self._pick_within("D", "D", limit, time.monotonic())) is None:
            ranks = sum(inst.registration.dp_size for inst in self.registry.live("D", time.monotonic()))
            if self.decode_queue >= limit * ranks:
                raise _decode_full(limit)
            freed = self._slot_freed
            self.decode_queue += 1
            self.metrics.decode_queue.inc()
            try:
                async with asyncio.timeout_at(until):
                    await freed.wait()
            except TimeoutError:
                if deadline.ended(until):
                    raise deadline_exceeded(deadline.describe("waiting for a decode slot")) from None
                raise _decode_full(limit) from None
            finally:
                self.decode_queue -= 1
                self.metrics.decode_queue.dec()
        return target


def _no_live(role: InstanceRole | None) -> ApiError:
    what = {"P": "prefill", "D": "decode"}.get(role or "", "engine")
    return no_instance(f"no live {what} instance is registered", f"no_{what}_instance")


def _decode_full(limit: int) -> ApiError:
    return overloaded(
        f"every decode engine already has {limit} requests in flight (its max_num_seqs) and a full queue",
        "decode_at_capacity",
        retry_after=1,
    )


class Holding:
    """``Placement.holding``: a class, not a generator context manager (contextlib's stays interpreted
    under mypyc)."""

    __slots__ = ("_placement", "_slots")

    def __init__(self, placement: Placement, slots: list[Slot]) -> None:
        self._placement = placement
        self._slots = slots

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        self._placement._release(self._slots)
