"""Pure: which rates to measure (sweep, goodput search) and the goodput a set of probes implies.

Goodput (DistServe's definition) is the highest request rate whose SLO attainment reaches the target.
The search is a state machine over the probes measured so far, so the shell only has to loop
``while (rate := next_search_rate(...)) is not None: measure(rate)`` and tests can drive it with a
synthetic attainment curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_SWEEP_STAGES = 1000


@dataclass(frozen=True)
class Probe:
    rate: float
    attainment: float


@dataclass(frozen=True)
class SearchParams:
    start_rate: float
    target: float
    rel_tolerance: float = 0.05
    """Stop when (lowest failing - highest passing) <= rel_tolerance * highest passing."""
    max_probes: int = 12
    growth: float = 2.0
    """Factor by which the bracket grows (passing) or shrinks (failing) before bisection."""
    span: float = 64.0
    """The search stays within [start_rate / span, start_rate * span]."""


@dataclass(frozen=True)
class Bracket:
    passing: float | None
    """Highest measured rate that reached the target below every failing rate (the goodput)."""
    failing: float | None
    """Lowest measured rate that missed the target."""


def bracket(probes: Sequence[Probe], target: float) -> Bracket:
    """Goodput bracket from probes. Conservative against noise: a passing rate above a failing one
    is ignored, because a curve that dips and recovers does not sustain the higher rate."""
    failing = min((p.rate for p in probes if p.attainment < target), default=None)
    passing = max(
        (p.rate for p in probes if p.attainment >= target and (failing is None or p.rate < failing)),
        default=None,
    )
    return Bracket(passing=passing, failing=failing)


def next_search_rate(params: SearchParams, probes: Sequence[Probe]) -> float | None:
    """The next rate to measure, or None when the goodput is known to the tolerance.

    Bracket first (multiply by ``growth`` while passing, divide while failing), then bisect.
    """
    if not probes:
        return params.start_rate
    if len(probes) >= params.max_probes:
        return None
    found = bracket(probes, params.target)
    if found.failing is None:
        assert found.passing is not None
        candidate = found.passing * params.growth
        return candidate if candidate <= params.start_rate * params.span else None
    if found.passing is None:
        candidate = found.failing / params.growth
        return candidate if candidate >= params.start_rate / params.span else None
    if found.failing - found.passing <= params.rel_tolerance * found.passing:
        return None
    return _round_rate((found.passing + found.failing) / 2)


def parse_sweep(spec: str) -> list[float]:
    """``FROM:TO:STEP`` -> the rates FROM, FROM+STEP, ..., up to TO inclusive."""
    try:
        start, stop, step = (float(part) for part in spec.split(":"))
    except ValueError:
        raise ValueError(f"sweep {spec!r} is not FROM:TO:STEP with three numbers") from None
    if not (start > 0 and step > 0 and stop >= start and all(map(math.isfinite, (start, stop, step)))):
        raise ValueError(f"sweep {spec!r} needs 0 < FROM <= TO and STEP > 0")
    count = math.floor((stop - start) / step + 1e-9) + 1
    if count > MAX_SWEEP_STAGES:
        raise ValueError(f"sweep {spec!r} has {count} stages; at most {MAX_SWEEP_STAGES}")
    return [_round_rate(start + i * step) for i in range(count)]


def _round_rate(rate: float) -> float:
    """Rates are printed and compared; keep them free of floating-point dust."""
    return round(rate, 9)
