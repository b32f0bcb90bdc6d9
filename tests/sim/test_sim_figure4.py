"""The points the seed's text gives for its Figure 4 (attainment against rate) against the discrete-event
model, mean of four arrival sequences per point.

Points the model reproduces stay within 10 of the seed. The ones it does not are asserted as deviations in
their documented direction (docs/simulator.md, "Attainment vs rate": the colocated collapse at 1-2 req/s
and the disaggregated tail at 10 req/s), so a model change that fixes one fails here until the docs say so.
"""

from __future__ import annotations

import statistics

import pytest

from pd_runtime.sim.profiles import QWEN3_235B_MI300X
from pd_runtime.sim.system import SEED_CURVE_POINTS, SEED_FIGURE4, SEED_FIGURE4_RATES, good_count

TOLERANCE = 10.0
SEEDS = range(4)
ABOVE_THE_SEED = {("2xTP4", 1.0), ("2xTP4", 2.0)}
BELOW_THE_SEED = {("read", 10.0), ("write", 10.0)}
TEXT_POINTS = [(name, rate, value) for name, points in SEED_CURVE_POINTS.items() for rate, value in points.items()]


def simulated(name: str, rate: float) -> float:
    return statistics.mean(good_count(QWEN3_235B_MI300X, name, rate, seed) for seed in SEEDS)


def test_the_figure_data_agree_with_the_text() -> None:
    for name, rate, value in TEXT_POINTS:
        assert abs(SEED_FIGURE4[name][SEED_FIGURE4_RATES.index(rate)] - value) <= 5, (name, rate)


@pytest.mark.parametrize(("name", "rate", "seed"), TEXT_POINTS)
def test_text_points(name: str, rate: float, seed: float) -> None:
    sim = simulated(name, rate)
    if (name, rate) in ABOVE_THE_SEED:
        assert sim - seed > TOLERANCE, "fixed? update docs/simulator.md and this list"
    elif (name, rate) in BELOW_THE_SEED:
        assert seed - sim > TOLERANCE, "fixed? update docs/simulator.md and this list"
    else:
        assert abs(sim - seed) <= TOLERANCE
