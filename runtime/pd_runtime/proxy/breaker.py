"""Pure: one engine instance's circuit breaker (no I/O, no clock of its own).

``closed``: in rotation; consecutive engine failures are counted. ``open``: no new request goes to it;
entered on a leg timeout (an engine that passes ``/health`` but never answers), after
``FAILURE_THRESHOLD`` consecutive engine failures, or when a request failed over from it.
``half_open``: after ``probes_needed`` good ``/health`` probes that follow a heartbeat sent since it
opened, exactly one trial request (a client request or the canary) may go to it; its success closes
the breaker, its failure opens it again and doubles ``probes_needed`` (up to ``MAX_PROBES_NEEDED``), so a
hung engine costs one trial per 1, 2, 4, ... probe intervals. Any leg that gets an answer from the
instance closes the breaker (an answer proves it serves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

CircuitState = Literal["closed", "open", "half_open"]
OpenReason = Literal["timeout", "failures", "failover", "trial"]
FAILURE_THRESHOLD = 3
MAX_PROBES_NEEDED = 64
STATE_VALUE: dict[CircuitState, int] = {"closed": 0, "half_open": 1, "open": 2}
"""The value of ``pd_proxy_instance_circuit_state``."""


@dataclass
class Breaker:
    state: CircuitState = "closed"
    reason: OpenReason | None = None
    """Why it last opened (kept while half-open)."""
    failures: int = 0
    """Consecutive engine failures."""
    opened_at: float | None = None
    """Monotonic time it last opened; heartbeats must be newer for it to go half-open."""
    probes_needed: int = 1
    good_probes: int = 0
    trial_out: bool = False
    """Half-open: the one trial request has been routed and has no verdict yet."""

    @property
    def admits(self) -> bool:
        """Whether a new request may be routed to the instance."""
        return self.state == "closed" or (self.state == "half_open" and not self.trial_out)

    def routed(self) -> None:
        """A request was routed to the instance: when half-open, it is the trial."""
        if self.state == "half_open":
            self.trial_out = True

    def answered(self) -> bool:
        """The instance answered a leg; True when that closed an open or half-open breaker."""
        reopened = self.state != "closed"
        self.state, self.reason, self.failures, self.opened_at = "closed", None, 0, None
        self.probes_needed, self.good_probes, self.trial_out = 1, 0, False
        return reopened

    def failed(self, timeout: bool, now: float) -> OpenReason | None:
        """An engine failure (no connection, lost connection, 5xx, or with ``timeout`` a leg timeout);
        the reason when this opened the breaker."""
        self.failures += 1
        if self.state == "half_open":
            self.probes_needed = min(2 * self.probes_needed, MAX_PROBES_NEEDED)
            return self._open("trial", now)
        if self.state == "open":
            return None
        if timeout:
            return self._open("timeout", now)
        if self.failures >= FAILURE_THRESHOLD:
            return self._open("failures", now)
        return None

    def failed_over(self, now: float) -> OpenReason | None:
        """A request left the instance for another one after a failure: it leaves the rotation too."""
        return None if self.state == "open" else self._open("failover", now)

    def abandoned(self) -> None:
        """A leg ended without a verdict on the engine (the client left, the KV never came): a trial
        in flight no longer counts, the next request may be one."""
        self.trial_out = False

    def probed(self, ok: bool, last_heartbeat: float | None) -> bool:
        """A ``/health`` result; True when it made an open breaker half-open. A static engine
        (``last_heartbeat`` None) needs no heartbeat."""
        if self.state != "open" or self.opened_at is None:
            return False
        if not ok:
            self.good_probes = 0
            return False
        if last_heartbeat is not None and last_heartbeat <= self.opened_at:
            return False
        self.good_probes += 1
        if self.good_probes < self.probes_needed:
            return False
        self.state, self.good_probes, self.trial_out = "half_open", 0, False
        return True

    def _open(self, reason: OpenReason, now: float) -> OpenReason:
        self.state, self.reason, self.opened_at, self.good_probes, self.trial_out = "open", reason, now, 0, False
        return reason

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "failures": self.failures}
