"""Rank priced layouts and say, in the seed's words, whether to disaggregate.

Order: layouts that meet the attainment target at the requested rate come first, and among those the
colocated ones (lower TTFT and no KV transfer to run: disaggregation would buy headroom the rate does
not need), then higher goodput, then lower TTFT p50. Layouts that miss the target follow, by attainment, then goodput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pd_runtime.plan.price import Priced


@dataclass(frozen=True)
class Verdict:
    text: str
    """"disaggregate: write mode, 1P TP4 + 1D TP4" or "stay colocated: 2xTP4"."""
    reason: str


def rank(priced: Sequence[Priced], target: float) -> list[Priced]:
    def key(p: Priced) -> tuple[float, ...]:
        meets = p.at_rate.attainment >= target
        ttft_p50 = p.ttft.p50 if p.ttft.p50 is not None else float("inf")
        if meets:
            return (0, p.layout.kind != "colocated", -p.goodput(target), ttft_p50)
        return (1, -p.at_rate.attainment, -p.goodput(target), ttft_p50)

    return sorted(priced, key=key)


def verdict(ranked: Sequence[Priced], rate: float, target: float, predicted: frozenset[str] = frozenset()) -> Verdict:
    """``predicted``: names of layouts timed by the TP scaling model; the verdict says so."""
    found = _verdict(ranked, rate, target)
    if ranked[0].layout.name in predicted:
        return Verdict(f"{found.text} (predicted)", found.reason)
    return found


def _verdict(ranked: Sequence[Priced], rate: float, target: float) -> Verdict:
    best = ranked[0]
    other_kind = next((p for p in ranked if p.layout.kind != best.layout.kind), None)
    pct = f"{100 * best.at_rate.attainment:.0f} %"
    if best.layout.kind == "disaggregated":
        text = f"disaggregate: write mode, {best.layout.name}"
        if other_kind is None:
            return Verdict(text, f"{pct} of requests meet both SLOs at {rate:g} req/s")
        return Verdict(
            text,
            f"{pct} of requests meet both SLOs at {rate:g} req/s against {_pct(other_kind)} for the best "
            f"colocated layout ({other_kind.layout.name}), whose misses are {_misses(other_kind)}",
        )
    text = f"stay colocated: {best.layout.name}"
    if other_kind is None:
        return Verdict(text, f"{pct} of requests meet both SLOs at {rate:g} req/s")
    if best.at_rate.attainment >= target:
        return Verdict(
            text,
            f"{pct} meet both SLOs at {rate:g} req/s with TTFT p50 {_ms(best)} against {_ms(other_kind)} for "
            f"{other_kind.layout.name}; disaggregation's headroom (goodput {other_kind.goodput(target):g} against "
            f"{best.goodput(target):g} req/s) is not needed at this rate",
        )
    return Verdict(
        text,
        f"{pct} meet both SLOs at {rate:g} req/s against {_pct(other_kind)} for the best disaggregated layout "
        f"({other_kind.layout.name}), whose misses are {_misses(other_kind)}",
    )


def _pct(p: Priced) -> str:
    return f"{100 * p.at_rate.attainment:.0f} %"


def _ms(p: Priced) -> str:
    return "n/a" if p.ttft.p50 is None else f"{1000 * p.ttft.p50:.0f} ms"


def _misses(p: Priced) -> str:
    if not p.ttft_misses and not p.itl_misses:
        return "none"
    if p.itl_misses >= p.ttft_misses:
        return f"mostly ITL ({p.itl_misses} ITL, {p.ttft_misses} TTFT of {p.at_rate.total})"
    return f"mostly TTFT ({p.ttft_misses} TTFT, {p.itl_misses} ITL of {p.at_rate.total})"
