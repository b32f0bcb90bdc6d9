"""Ranking and the seed-style verdict, on hand-made results (no simulation)."""

from __future__ import annotations

from pd_runtime.plan.layouts import NodeLayout
from pd_runtime.plan.price import Priced, RatePoint
from pd_runtime.plan.rank import rank, verdict

COLOCATED = NodeLayout("colocated", engines=2, engine_tp=4)
TP8 = NodeLayout("colocated", engines=1, engine_tp=8)
DISAGG = NodeLayout("disaggregated", 1, 4, 1, 4)


def priced(layout: NodeLayout, good: int, grid: list[int], ttft: float = 0.3, itl_misses: int = 0) -> Priced:
    curve = [RatePoint(rate=float(i + 1), good=g, total=100) for i, g in enumerate(grid)]
    return Priced(
        layout, curve, RatePoint(8.0, good, 100), [ttft] * 100, [0.03] * 100, 100 - good - itl_misses, itl_misses
    )


def test_goodput_is_the_highest_rate_before_the_first_miss() -> None:
    p = priced(DISAGG, 73, [100, 100, 95, 80, 92])
    assert p.goodput(0.9) == 3.0
    assert priced(DISAGG, 10, [50, 100]).goodput(0.9) == 0.0


def test_below_target_ranks_by_attainment_and_says_disaggregate() -> None:
    ranked = rank([priced(COLOCATED, 29, [100, 60, 25], itl_misses=71), priced(DISAGG, 73, [100, 100, 100])], 0.9)
    assert ranked[0].layout is DISAGG
    found = verdict(ranked, 8.0, 0.9)
    assert found.text == "disaggregate: write mode, 1P TP4 + 1D TP4"
    assert "73 %" in found.reason and "2xTP4" in found.reason and "mostly ITL" in found.reason


def test_when_every_layout_meets_the_target_colocated_wins_then_goodput() -> None:
    ranked = rank(
        [
            priced(DISAGG, 100, [100] * 10, ttft=0.23),
            priced(TP8, 100, [100] * 3 + [50], ttft=0.18),
            priced(COLOCATED, 100, [100] * 5 + [50], ttft=0.19),
        ],
        0.9,
    )
    assert [p.layout for p in ranked] == [COLOCATED, TP8, DISAGG]
    found = verdict(ranked, 0.5, 0.9)
    assert found.text == "stay colocated: 2xTP4"
    assert "not needed" in found.reason
