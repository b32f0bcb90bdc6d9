"""Pure: which registration frames may change the registry, and how fast (no I/O; time is passed in).

vLLM's MoRI-IO connector cannot authenticate its heartbeats (a DEALER sends one msgpack map,
docs/protocol.md#registration-socket), so whoever reaches the registration socket could announce an
engine and receive client requests, prompts and the engines' bearer token with them. With hostNetwork
the proxy's loopback is the node's. Two regimes:

* **Told its engines** (``--expected-engine``, one per engine the operator rendered, each the G2
  heartbeat that engine sends; or ``--engine``, whose colocated engines never register): a frame is
  accepted only when it describes one of them field for field (``MATCHED_FIELDS``); only the
  generation may differ. Anything else is refused: ``refused_unknown`` for an HTTP address not listed,
  ``refused_mismatch`` for a listed address with another side-channel host, port, size or mode.
* **Discovery** (neither flag, a standalone ``pdctl proxy``): any well-formed frame within bounds:
  ``dp_size`` and ``tp_size`` at most ``MAX_DP_SIZE``/``MAX_TP_SIZE`` (routing builds one slot per DP
  rank on every request) and at most ``max_instances`` instances (``refused_bounds``); new or changed
  instances at most ``NEW_INSTANCES_PER_S`` per second (``rate_limited``); and a known instance's
  side-channel host never changes while it lives (``refused_mismatch``): the proxy puts that host in
  every request id, so a changed one would send both engines' KV traffic elsewhere.

Heartbeats that only refresh a known instance are never rate limited. Refusals are counted by the
caller and summarised here, one log line per ``SUMMARY_INTERVAL_S`` whatever the flood.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pd_runtime.protocol import ProtocolError, Registration, registration_from_map

Refusal = Literal["refused_unknown", "refused_mismatch", "refused_bounds", "rate_limited"]

# One vLLM instance's global sizes: 64 is eight nodes of eight GPUs in one Wide-EP instance, far more
# than any rendered pod (one node). A frame above them is not an engine we could serve.
MAX_DP_SIZE = 64
MAX_TP_SIZE = 64
DEFAULT_MAX_INSTANCES = 64
# New or changed instances: a fleet starting at once gets BURST in at its first beat, the rest at their
# next beats (3 s apart in G2).
NEW_INSTANCES_PER_S = 4.0
NEW_INSTANCES_BURST = 32
# Frames the listener decodes per second, whatever they say: about 3 % of a core at ~60 us a frame.
# Past it the listener waits and ZMQ keeps the rest queued per connection (the ROUTER fair-queues
# connections, so each engine's own heartbeats keep getting through a flood on another connection).
FRAMES_PER_S = 500.0
FRAMES_BURST = 500
SUMMARY_INTERVAL_S = 10.0

# Every field vLLM's G2 heartbeat carries (docs/protocol.md#registration-g2), as Registration names them;
# G1 frames carry the same.
MATCHED_FIELDS = (
    "role",
    "http_address",
    "host",
    "handshake_port",
    "notify_port",
    "dp_size",
    "tp_size",
    "transfer_mode",
)


@dataclass(frozen=True)
class Verdict:
    """Why a frame may not change the registry."""

    result: Refusal
    reason: str


def parse_expected_engine(text: str) -> Registration:
    """One ``--expected-engine``: the JSON of the G2 heartbeat that engine sends (docs/protocol.md#registration-g2)."""
    try:
        return registration_from_map(json.loads(text))
    except (json.JSONDecodeError, ProtocolError) as exc:
        raise ValueError(f"--expected-engine wants the engine's G2 heartbeat as JSON: {exc}") from None


def differences(frame: Registration, expected: Registration) -> list[str]:
    """The matched fields in which ``frame`` differs from ``expected``, described."""
    return [
        f"{name} {getattr(frame, name)!r} (expected {getattr(expected, name)!r})"
        for name in MATCHED_FIELDS
        if getattr(frame, name) != getattr(expected, name)
    ]


def judge_expected(frame: Registration, expected: Mapping[str, Registration]) -> Verdict | None:
    """Against the engines the proxy was told of (by HTTP address); None: it is one of them."""
    listed = expected.get(frame.http_address)
    if listed is None:
        return Verdict(
            "refused_unknown",
            f"{frame.role} {frame.http_address} is not one of the {len(expected)} engines the proxy was told of",
        )
    differ = differences(frame, listed)
    if differ:
        return Verdict("refused_mismatch", f"{frame.http_address} differs from its listed engine: {', '.join(differ)}")
    return None


def judge_discovery(
    frame: Registration, known: Registration | None, instances: int, max_instances: int
) -> Verdict | None:
    """Without a list: the bounds and the pinned side-channel host; None: it may be applied."""
    if frame.dp_size > MAX_DP_SIZE or frame.tp_size > MAX_TP_SIZE:
        return Verdict(
            "refused_bounds",
            f"{frame.http_address} announces dp_size {frame.dp_size}, tp_size {frame.tp_size} "
            f"(at most {MAX_DP_SIZE} and {MAX_TP_SIZE})",
        )
    if known is None and instances >= max_instances:
        return Verdict("refused_bounds", f"{frame.http_address}: already {instances} instances (--max-instances)")
    if known is not None and known.host != frame.host:
        return Verdict(
            "refused_mismatch",
            f"{frame.http_address} announces side-channel host {frame.host!r}, registered with {known.host!r}",
        )
    return None


def judge(
    frame: Registration,
    known: Registration | None,
    instances: int,
    expected: Mapping[str, Registration] | None,
    max_instances: int,
) -> Verdict | None:
    """The one decision: None when the frame may change the registry (``expected`` None: discovery)."""
    if expected is not None:
        return judge_expected(frame, expected)
    return judge_discovery(frame, known, instances, max_instances)


def expected_by_address(engines: Sequence[Registration]) -> dict[str, Registration]:
    by_address = {engine.http_address: engine for engine in engines}
    if len(by_address) != len(engines):
        raise ValueError("--expected-engine lists one HTTP address twice")
    return by_address


@dataclass
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; starts full."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    at: float | None = None  # monotonic time of the last use

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now

    def take(self, now: float) -> bool:
        """One token if there is one."""
        self._refill(now)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def reserve(self, now: float) -> float:
        """One token now, borrowed if need be; returns how long to wait before using it (0: at once)."""
        self._refill(now)
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


@dataclass
class RefusalSummary:
    """Refused frames counted by result since the last log line, with the last reason of each."""

    interval_s: float = SUMMARY_INTERVAL_S
    counts: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)
    logged_at: float | None = None

    def add(self, verdict: Verdict) -> None:
        self.counts[verdict.result] += 1
        self.reasons[verdict.result] = verdict.reason

    def due(self, now: float) -> str | None:
        """The line to log now, if any (the first refusal after a quiet interval is logged at once)."""
        if not self.counts or (self.logged_at is not None and now - self.logged_at < self.interval_s):
            return None
        line = "; ".join(
            f"{result} x{count} (last: {self.reasons[result]})" for result, count in sorted(self.counts.items())
        )
        self.counts.clear()
        self.reasons.clear()
        self.logged_at = now
        return line
