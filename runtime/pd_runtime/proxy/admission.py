"""Pure: at most ``--max-in-flight`` client requests at once, the next ones waiting in a bounded FIFO.

``Admission`` decides (no I/O, no clock of its own): who is admitted, who waits, who is refused, and how
long a refused client should wait before it tries again (``Retry-After``). ``admission_gate`` is the thin
asyncio shell the API handlers go through. A slot that frees goes to the head of the queue, never to a
request that arrives just then (no barging), so queued requests are served in arrival order.

``Retry-After`` by Little's law: with ``limit`` slots, each held ``service_s`` on average (a moving average
of how long admitted requests held theirs), slots free at ``limit / service_s`` per second, so a client
that comes back finds the ``queued`` requests ahead of it served after ``(queued + 1) * service_s / limit``
seconds. Rounded up to whole seconds (RFC 9110's delay-seconds), at least 1 and at most 60 (what the
OpenAI SDKs honour); 1 before any request has finished.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from pd_runtime.proxy.errors import ApiError, overloaded

Decision = Literal["admitted", "queued", "full"]
RETRY_AFTER_MAX_S = 60
SERVICE_WEIGHT = 0.2  # of the newest request in the moving average of slot holding times


@dataclass
class Admission:
    """Slots and the FIFO of waiting tickets. ``limit`` 0: no limit (everyone admitted, nothing queued)."""

    limit: int = 0
    max_queued: int = 0
    in_flight: int = 0
    service_s: float | None = None  # moving average of how long admitted requests held their slot

    def __post_init__(self) -> None:
        self._waiting: deque[int] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _room(self) -> bool:
        return not self.limit or self.in_flight < self.limit

    def arrive(self, ticket: int) -> Decision:
        """A new request: a free slot (when nobody waits for one), a place in the queue, or neither."""
        if self._room() and not self._waiting:
            self.in_flight += 1
            return "admitted"
        if self.limit and len(self._waiting) < self.max_queued:
            self._waiting.append(ticket)
            return "queued"
        return "full"

    def leave(self, ticket: int) -> bool:
        """A queued request gives up (its wait expired, its client left); False when it is no longer
        waiting because it was just admitted (it then holds a slot, which the caller must release)."""
        try:
            self._waiting.remove(ticket)
        except ValueError:
            return False
        return True

    def release(self, held_s: float | None) -> list[int]:
        """An admitted request is done after holding its slot ``held_s`` (None: it was never served, its
        client left as the slot reached it); the tickets admitted in its place."""
        self.in_flight -= 1
        if held_s is not None:
            previous = self.service_s
            self.service_s = held_s if previous is None else previous + SERVICE_WEIGHT * (held_s - previous)
        return self._admit_waiting()

    def reconfigure(self, limit: int, max_queued: int) -> list[int]:
        """New settings (a reload): a higher limit admits waiting tickets at once; a smaller queue keeps
        the tickets already in it and refuses new ones until it is below the bound."""
        self.limit, self.max_queued = limit, max_queued
        return self._admit_waiting()

    def drain(self) -> list[int]:
        """Every waiting ticket, removed (shutdown: they are answered 503)."""
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting

    def _admit_waiting(self) -> list[int]:
        admitted = []
        while self._waiting and self._room():
            admitted.append(self._waiting.popleft())
            self.in_flight += 1
        return admitted

    def retry_after(self) -> int:
        """Seconds a refused client should wait before trying again (module docstring)."""
        if self.service_s is None or not self.limit:
            return 1
        estimate = (len(self._waiting) + 1) * self.service_s / self.limit
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(estimate)))

    def to_json(self) -> dict[str, object]:
        service = None if self.service_s is None else round(self.service_s, 3)
        return {
            "max_in_flight": self.limit,
            "max_queued": self.max_queued,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "service_s": service,
        }


def too_many_requests(message: str, retry_after: int) -> ApiError:
    """OpenAI's rate-limit answer: 429, ``code: rate_limit_exceeded``, with when to come back."""
    return overloaded(message, "rate_limit_exceeded", retry_after)
