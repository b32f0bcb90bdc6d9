"""Pure: a request's one deadline (docs/proxy.md, "Failure contract").

A client request gets its deadline when it arrives, ``--response-timeout`` seconds later: the admission
queue, routing and the wait for a decode slot, both legs, a failover and the whole answer, streamed or not,
end by it. Inside it a phase may have a shorter bound of its own, which finds what the deadline would find
too late: a hung engine (``--prefill-timeout``, ``--first-byte-timeout``, ``--idle-timeout``), a transfer
that can no longer come (``--kv-wait-timeout``), a queue that does not move (``--queue-timeout``). A wait is
scheduled to end at ``bound(due)``; when it has ended, ``ended(when)`` says which of the two ended it: the
deadline (504 ``deadline_exceeded``) or the phase's bound (the cause that bound stands for).

Times are the event loop's clock; nothing here reads one, so the tests give the times.
"""

from __future__ import annotations


class Deadline:
    """A plain class with slots, not a dataclass: one is built per request (``legs.ClientRequest`` says why).
    Never changed once built."""

    __slots__ = ("at", "seconds")

    def __init__(self, at: float, seconds: float) -> None:
        self.at = at
        """Loop time by which the request has its whole answer."""
        self.seconds = seconds
        """The setting it came from (``--response-timeout``), for the client's message."""

    @classmethod
    def after(cls, now: float, seconds: float) -> Deadline:
        return cls(now + seconds, seconds)

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r}, seconds={self.seconds!r})"

    def bound(self, due: float) -> float:
        """When a wait whose own bound is ``due`` must end."""
        return min(due, self.at)

    def ended(self, when: float) -> bool:
        """Whether a wait scheduled to end at ``when`` (a ``bound``) was ended by the deadline, not by its own
        bound: a bound equal to the deadline is the deadline's."""
        return when >= self.at

    def describe(self, phase: str) -> str:
        return f"the request's deadline of {self.seconds:g} s (--response-timeout) passed {phase}"
