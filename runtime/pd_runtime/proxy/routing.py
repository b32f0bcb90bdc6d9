"""Choosing instances and DP ranks. Pure functions plus a small counter-keeping Router (no I/O).

Every (instance, DP rank) pair is a slot. Slots are walked "flat interleaved" (rank 0 of every
instance, then rank 1, ...) like the newest toy proxy, so no rank is stranded (docs/protocol.md#toy-proxy);
instances with different ``dp_size`` are handled, which the toy proxy assumes away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pd_runtime.proxy import affinity
from pd_runtime.proxy.load import EngineLoad

Policy = Literal["round_robin", "least_outstanding", "least_load", "prefix_affinity"]
POLICIES: tuple[Policy, ...] = ("round_robin", "least_outstanding", "least_load", "prefix_affinity")
DEFAULT_MAX_IMBALANCE = 4
# An engine core this full of KV cache is about to preempt (vLLM recomputes the newest sequence): it gets
# a request only when every other one is as full.
KV_USAGE_HIGH = 0.9


class Candidate:
    """An instance a pick may choose, one per live instance per pick: a plain class with slots, not a
    dataclass (``legs.ClientRequest`` says why)."""

    __slots__ = ("dp_size", "key", "load")

    def __init__(self, key: str, dp_size: int, load: Mapping[int, EngineLoad] | None = None) -> None:
        self.key = key  # http_address
        self.dp_size = dp_size
        self.load: Mapping[int, EngineLoad] = {} if load is None else load  # DP rank -> fresh report; {} if none


Slot = tuple[str, int | None]
"""An instance's key and a DP rank (None when the instance has a single DP rank: no header is sent). A dict
key on every request (the router's in-flight counts): a tuple hashes and compares in C, where a frozen
dataclass ran its generated ``__hash__`` and ``__eq__`` as Python; a plain tuple, not a NamedTuple, whose
generated ``__new__`` ran as Python for every slot of every pick, compiled or not (docs/benchmarks.md)."""


def interleaved_slots(candidates: Sequence[Candidate]) -> list[Slot]:
    widest = max((c.dp_size for c in candidates), default=0)
    return [(c.key, rank if c.dp_size > 1 else None) for rank in range(widest) for c in candidates if rank < c.dp_size]


def slots_with_room(candidates: Sequence[Candidate], outstanding: Mapping[Slot, int], limit: int) -> list[Slot]:
    """The slots with fewer than ``limit`` requests in flight (every slot when ``limit`` is 0)."""
    slots = interleaved_slots(candidates)
    return [slot for slot in slots if outstanding.get(slot, 0) < limit] if limit > 0 else slots


def round_robin(slots: list[Slot], counter: int) -> Slot:
    return slots[counter % len(slots)]


def least_outstanding(slots: list[Slot], outstanding: Mapping[Slot, int], counter: int) -> Slot:
    """The slot with the fewest requests in flight; ties go round-robin so idle slots share load."""
    start = counter % len(slots)
    rotated = slots[start:] + slots[:start]
    return min(rotated, key=lambda slot: outstanding.get(slot, 0))


def slot_loads(candidates: Sequence[Candidate]) -> dict[Slot, EngineLoad]:
    """Each slot's reported load (a single-rank instance reports as engine 0)."""
    return {
        (c.key, rank if c.dp_size > 1 else None): load
        for c in candidates
        for rank, load in c.load.items()
        if rank < c.dp_size
    }


def least_load(
    slots: list[Slot], outstanding: Mapping[Slot, int], loads: Mapping[Slot, EngineLoad], counter: int
) -> Slot:
    """The slot whose engine is least loaded by its own account, corrected by what the proxy knows.

    Order: KV cache below ``KV_USAGE_HIGH`` first; then the fewest requests, where the count is the
    larger of the proxy's own in-flight requests (exact now) and the engine's running + waiting (a
    scrape old, but it includes work the proxy does not see, and a slow engine's backlog); then fewer
    waiting; then less KV cache used; ties go round-robin. A slot without a fresh report counts only
    the proxy's in-flight requests.
    """
    start = counter % len(slots)
    rotated = slots[start:] + slots[:start]
    return min(rotated, key=lambda slot: pressure(slot, outstanding, loads))


def pressure(
    slot: Slot, outstanding: Mapping[Slot, int], loads: Mapping[Slot, EngineLoad]
) -> tuple[bool, int, int, float]:
    """How loaded a slot is, in ``least_load``'s order: KV cache nearly full, requests, waiting, KV used."""
    mine = outstanding.get(slot, 0)
    reported = loads.get(slot)
    if reported is None:
        return (False, mine, 0, 0.0)
    return (reported.kv_usage >= KV_USAGE_HIGH, max(mine, reported.queue), reported.waiting, reported.kv_usage)


def prefix_affinity(
    slots: list[Slot],
    outstanding: Mapping[Slot, int],
    loads: Mapping[Slot, EngineLoad],
    counter: int,
    key: bytes | None,
    max_imbalance: int = DEFAULT_MAX_IMBALANCE,
) -> Slot:
    """The instance the prompt's prefix hashes to on the ring of ``slots``' instances (``affinity``; its
    least loaded DP rank), unless it is saturated: its KV cache nearly full while another's is not, or
    more than ``max_imbalance`` requests more than the least loaded slot. Then, and without a key, the
    least loaded slot (``least_load``): a cache miss costs one prefill, a queue behind a hot prefix
    costs every request in it."""
    best = least_load(slots, outstanding, loads, counter)
    if key is None:
        return best
    home = affinity.owner((slot[0] for slot in slots), key)
    chosen = least_load([slot for slot in slots if slot[0] == home], outstanding, loads, counter)
    mine, least = pressure(chosen, outstanding, loads), pressure(best, outstanding, loads)
    if (mine[0] and not least[0]) or mine[1] > least[1] + max_imbalance:
        return best
    return chosen


def decode_dp_rank(prefill_rank: int | None, prefill_dp: int, decode_rank: int | None, decode_dp: int) -> int | None:
    """docs/protocol.md#decode-leg-params: D's rank must be in D's range; the same as P's when the DP sizes match
    (both legs on the same rank, PR #46115), otherwise D's own choice."""
    if decode_dp <= 1:
        return None
    if prefill_rank is not None and prefill_dp == decode_dp:
        return prefill_rank
    return decode_rank


class Router:
    """Per-role request counters and in-flight counts per slot; the policy functions decide."""

    def __init__(self, policy: Policy, max_imbalance: int = DEFAULT_MAX_IMBALANCE) -> None:
        self.policy = policy
        self.max_imbalance = max_imbalance
        # Plain dicts, not collections.Counter: Counter's ``__missing__`` and ``+=`` through it are Python,
        # run on every pick, acquire and release even compiled (docs/benchmarks.md).
        self._counters: dict[str, int] = {}
        self._outstanding: dict[Slot, int] = {}
        self._routed: dict[str, int] = {}  # requests ever sent to each instance (for /status)

    def pick(self, pool: str, candidates: Sequence[Candidate], limit: int = 0, key: bytes | None = None) -> Slot | None:
        """Choose a slot among ``candidates`` (non-empty) for the pool named ``pool`` (P, D, E); None when
        every slot already has ``limit`` requests in flight (0: no limit). ``key``: the prompt's prefix
        (``affinity.prefix_key``) for ``prefix_affinity``, which places the engines that compute prompts
        (P, E) by it and decode, which receives the KV, by load."""
        slots = slots_with_room(candidates, self._outstanding, limit)
        if not slots:
            return None
        counter = self._counters.get(pool, 0)
        self._counters[pool] = counter + 1
        if self.policy == "least_outstanding":
            return least_outstanding(slots, self._outstanding, counter)
        if self.policy == "least_load" or (self.policy == "prefix_affinity" and pool == "D"):
            return least_load(slots, self._outstanding, slot_loads(candidates), counter)
        if self.policy == "prefix_affinity":
            loads = slot_loads(candidates)
            return prefix_affinity(slots, self._outstanding, loads, counter, key, self.max_imbalance)
        return round_robin(slots, counter)

    def acquire(self, slot: Slot) -> None:
        outstanding = self._outstanding
        outstanding[slot] = outstanding.get(slot, 0) + 1
        self._routed[slot[0]] = self._routed.get(slot[0], 0) + 1

    def release(self, slot: Slot) -> None:
        left = self._outstanding.get(slot, 0) - 1
        if left > 0:
            self._outstanding[slot] = left
        else:
            self._outstanding.pop(slot, None)

    def outstanding(self, slot: Slot) -> int:
        return self._outstanding.get(slot, 0)

    def in_flight(self, key: str) -> int:
        """Requests in flight on an instance, over all its DP ranks."""
        return sum(n for (slot_key, _), n in self._outstanding.items() if slot_key == key)

    def routed(self, key: str) -> int:
        return self._routed.get(key, 0)
