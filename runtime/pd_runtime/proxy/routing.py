"""Choosing instances and DP ranks. Pure functions plus a small counter-keeping Router (no I/O).

Every (instance, DP rank) pair is a slot. Slots are walked "flat interleaved" (rank 0 of every
instance, then rank 1, ...) like the newest toy proxy, so no rank is stranded (§6.3); instances with
different ``dp_size`` are handled, which the toy proxy assumes away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["round_robin", "least_outstanding"]
POLICIES: tuple[Policy, ...] = ("round_robin", "least_outstanding")


@dataclass(frozen=True)
class Candidate:
    key: str  # http_address
    dp_size: int


@dataclass(frozen=True)
class Slot:
    key: str
    dp_rank: int | None  # None when the instance has a single DP rank (no header is sent)


def interleaved_slots(candidates: Sequence[Candidate]) -> list[Slot]:
    widest = max((c.dp_size for c in candidates), default=0)
    return [
        Slot(c.key, rank if c.dp_size > 1 else None) for rank in range(widest) for c in candidates if rank < c.dp_size
    ]


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


def decode_dp_rank(prefill_rank: int | None, prefill_dp: int, decode_rank: int | None, decode_dp: int) -> int | None:
    """§9.1 item 4: D's rank must be in D's range; the same as P's when the DP sizes match
    (both legs on the same rank, PR #46115), otherwise D's own choice."""
    if decode_dp <= 1:
        return None
    if prefill_rank is not None and prefill_dp == decode_dp:
        return prefill_rank
    return decode_rank


class Router:
    """Per-role request counters and in-flight counts per slot; the policy functions decide."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._counters: Counter[str] = Counter()
        self._outstanding: Counter[Slot] = Counter()

    def pick(self, pool: str, candidates: Sequence[Candidate], limit: int = 0) -> Slot | None:
        """Choose a slot among ``candidates`` (non-empty) for the pool named ``pool`` (P, D, E); None when
        every slot already has ``limit`` requests in flight (0: no limit)."""
        slots = slots_with_room(candidates, self._outstanding, limit)
        if not slots:
            return None
        counter = self._counters[pool]
        self._counters[pool] += 1
        if self.policy == "least_outstanding":
            return least_outstanding(slots, self._outstanding, counter)
        return round_robin(slots, counter)

    def acquire(self, slot: Slot) -> None:
        self._outstanding[slot] += 1

    def release(self, slot: Slot) -> None:
        self._outstanding[slot] -= 1
        if self._outstanding[slot] <= 0:
            del self._outstanding[slot]

    def outstanding(self, slot: Slot) -> int:
        return self._outstanding.get(slot, 0)
