"""Pure statistics: percentiles, distribution summaries and the Wilson score interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054
"""Two-sided 95 % normal quantile."""


@dataclass(frozen=True)
class Distribution:
    """p50/p90/p99/mean of one latency metric; None when there was nothing to measure."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None

    def as_dict(self, digits: int = 3) -> dict[str, float | None]:
        return {name: _round(value, digits) for name, value in vars(self).items()}


EMPTY = Distribution(None, None, None, None)


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between ranks (numpy's default method).

    Chosen because it is what vLLM's and most other benchmarks print, so numbers compare directly.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


def summarize(values: Sequence[float]) -> Distribution:
    if not values:
        return EMPTY
    return Distribution(
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=math.fsum(values) / len(values),
    )


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Unlike the normal approximation it stays inside [0, 1] and is honest at 0 % and 100 %, which is
    exactly where SLO attainment usually sits. With no trials nothing is known: (0, 1).
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"invalid proportion {successes}/{trials}")
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    z2 = z * z
    denominator = 1.0 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    # At 0 % and 100 % the bound is exactly 0 or 1; say so rather than leave rounding dust.
    low = 0.0 if successes == 0 else max(0.0, centre - half_width)
    high = 1.0 if successes == trials else min(1.0, centre + half_width)
    return (low, high)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
