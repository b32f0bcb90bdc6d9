"""Pure: the figures of one stage (one rate) from its judged requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pd_runtime.bench.slo import RequestOutcome, RequestTiming, Slo, judge
from pd_runtime.bench.stats import Distribution, summarize, wilson_interval


@dataclass(frozen=True)
class StageResult:
    """One stage: N measured requests at one offered rate. Warm-up requests are already excluded."""

    rate: float
    requests: int
    good: int
    errors: int
    attainment: float
    attainment_ci: tuple[float, float]
    ttft_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    send_lag_ms: Distribution
    short_replies: int
    achieved_rate: float | None
    duration_s: float
    error_kinds: dict[str, int] = field(default_factory=dict)
    records: tuple[RequestOutcome, ...] = ()

    def passes(self, target: float) -> bool:
        return self.attainment >= target


def summarize_stage(rate: float, timings: Sequence[RequestTiming], slo: Slo, output_tokens: int) -> StageResult:
    """Attainment = good / sent over the measured (non-warm-up) requests; errors count as failures.

    Latency distributions cover successful requests only (a timeout has no meaningful TTFT).
    """
    measured = [t for t in timings if not t.warmup]
    outcomes = tuple(judge(t, slo, output_tokens) for t in measured)
    good = sum(o.good for o in outcomes)
    failed = [o for o in outcomes if o.error is not None]
    sent = len(outcomes)
    return StageResult(
        rate=rate,
        requests=sent,
        good=good,
        errors=len(failed),
        attainment=good / sent if sent else 0.0,
        attainment_ci=wilson_interval(good, sent),
        ttft_ms=summarize([o.ttft_ms for o in outcomes if o.ttft_ms is not None]),
        itl_ms=summarize([o.itl_ms for o in outcomes if o.itl_ms is not None]),
        e2e_ms=summarize([o.e2e_ms for o in outcomes if o.error is None]),
        send_lag_ms=summarize([o.lag_ms for o in outcomes]),
        short_replies=sum(o.short for o in outcomes),
        achieved_rate=_achieved_rate([o.sent_s for o in outcomes]),
        duration_s=_duration(measured),
        error_kinds=dict(Counter(error_kind(o.error) for o in failed if o.error is not None)),
        records=outcomes,
    )


def error_kind(error: str) -> str:
    """The category of an error message: the text before its first colon (e.g. ``http_500``)."""
    return error.split(":", 1)[0].strip()


def _achieved_rate(sent_s: Sequence[float]) -> float | None:
    """Arrivals per second actually produced: (n - 1) gaps over the span of send times."""
    if len(sent_s) < 2:
        return None
    span = max(sent_s) - min(sent_s)
    return (len(sent_s) - 1) / span if span > 0 else None


def _duration(measured: Sequence[RequestTiming]) -> float:
    """From the first measured send to the last measured response end (includes the drain)."""
    if not measured:
        return 0.0
    return max(t.end_s for t in measured) - min(t.sent_s for t in measured)
