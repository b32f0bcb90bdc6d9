"""Pure: the demand this proxy sees, over a sliding window (its admin /status ``demand``).

The operator sums it over the replicas (status.demand) and sets replicas from it against the measured
capacity (docs/autoscaling.md). Counted per one-second bucket, so a report costs O(window) and memory
stays bounded whatever the request rate: arrivals of client requests (the canary's are not demand), the
output tokens each asked for (``max_tokens`` or ``max_completion_tokens``: the workload's shape as the
probe's ``outputTokens`` describes it), and the prompt tokens prefill reported in its ``usage``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

WINDOW_S = 30.0


@dataclass
class _Bucket:
    second: int
    arrivals: int = 0
    asked: int = 0  # arrivals that named their output length
    output_tokens: int = 0
    prompts: int = 0  # prefill answers that reported their prompt length
    prompt_tokens: int = 0


class DemandWindow:
    """Arrivals and lengths of the last ``window_s`` seconds, bucketed by second of the monotonic clock."""

    def __init__(self, started: float, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._started = started
        self._buckets: deque[_Bucket] = deque()

    def _bucket(self, now: float) -> _Bucket:
        second = math.floor(now)
        if not self._buckets or self._buckets[-1].second != second:
            self._buckets.append(_Bucket(second))
            self._expire(now)
        return self._buckets[-1]

    def _expire(self, now: float) -> None:
        oldest = math.floor(now - self.window_s)
        while self._buckets and self._buckets[0].second < oldest:
            self._buckets.popleft()

    def arrived(self, now: float, output_tokens: int | None) -> None:
        bucket = self._bucket(now)
        bucket.arrivals += 1
        if output_tokens is not None:
            bucket.asked += 1
            bucket.output_tokens += output_tokens

    def prompt_measured(self, now: float, prompt_tokens: int) -> None:
        bucket = self._bucket(now)
        bucket.prompts += 1
        bucket.prompt_tokens += prompt_tokens

    def report(self, now: float, in_flight: int, queued: int) -> dict[str, Any]:
        """The window's figures; the rate divides by the time covered (shorter just after a start)."""
        self._expire(now)
        covered = max(1.0, min(self.window_s, now - self._started))
        buckets = list(self._buckets)
        arrivals = sum(b.arrivals for b in buckets)
        return {
            "window_s": round(covered, 3),
            "requests_per_second": round(arrivals / covered, 4),
            "arrivals": arrivals,
            "in_flight": in_flight,
            "queued": queued,
            "output_tokens": {"requests": sum(b.asked for b in buckets), "sum": sum(b.output_tokens for b in buckets)},
            "prompt_tokens": {
                "requests": sum(b.prompts for b in buckets),
                "sum": sum(b.prompt_tokens for b in buckets),
            },
        }


def asked_output_tokens(body: dict[str, Any]) -> int | None:
    """The output length a client request asked for, if it named one as a positive integer."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def reported_prompt_tokens(document: Any) -> int | None:
    """``usage.prompt_tokens`` of an engine's whole answer, if it is a non-negative integer."""
    usage = document.get("usage") if isinstance(document, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
