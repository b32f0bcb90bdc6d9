"""The points the seed's text gives for its Figure 4 (attainment against rate) against the discrete-event
model.

The seed's Figure 4 is one sweep of `vllm bench serve` runs that all replay one arrival pattern (the tool's
fixed --seed), so the comparison replays the pattern reconstructed from the seed's figure 3
(``SEED_ARRIVAL_PATTERN``), one run per rate as the seed did. Points the model reproduces stay within 10 of
the seed. The colocated collapse at 1-2 req/s is not reproduced and is asserted as a deviation in its
documented direction (docs/simulator.md, "Attainment vs rate"), so a model change that fixes it fails here
until the docs say so. The mean over independent arrival draws falls far below the seed at 10 req/s: the
disaggregated tail is the pattern's, which the docs argue and the last test keeps true.
"""

from __future__ import annotations

import statistics

import pytest

from pd_runtime.sim.profiles import QWEN3_235B_MI300X
from pd_runtime.sim.system import (
    SEED_CURVE_POINTS,
    SEED_FIGURE4,
    SEED_FIGURE4_RATES,
    SEED_GOOD_AT_RATE_8,
    SEED_RATE,
    good_count,
    pattern_good_count,
)

TOLERANCE = 10.0
ABOVE_THE_SEED = {("2xTP4", 1.0), ("2xTP4", 2.0)}
TEXT_POINTS = [(name, rate, value) for name, points in SEED_CURVE_POINTS.items() for rate, value in points.items()]


def test_the_figure_data_agree_with_the_text() -> None:
    for name, rate, value in TEXT_POINTS:
        assert abs(SEED_FIGURE4[name][SEED_FIGURE4_RATES.index(rate)] - value) <= 5, (name, rate)


@pytest.mark.parametrize(("name", "rate", "seed"), TEXT_POINTS)
def test_text_points(name: str, rate: float, seed: float) -> None:
    sim = pattern_good_count(QWEN3_235B_MI300X, name, rate)
    if (name, rate) in ABOVE_THE_SEED:
        assert sim - seed > TOLERANCE, "fixed? update docs/simulator.md and this list"
    else:
        assert abs(sim - seed) <= TOLERANCE


@pytest.mark.parametrize("name", list(SEED_GOOD_AT_RATE_8))
def test_the_pattern_keeps_the_table_at_8_req_s(name: str) -> None:
    assert abs(pattern_good_count(QWEN3_235B_MI300X, name, SEED_RATE) - SEED_GOOD_AT_RATE_8[name]) <= 8


@pytest.mark.parametrize("name", ["read", "write"])
def test_independent_draws_do_not_give_the_tail(name: str) -> None:
    mean = statistics.mean(good_count(QWEN3_235B_MI300X, name, 10.0, seed) for seed in range(4))
    assert SEED_CURVE_POINTS[name][10.0] - mean > TOLERANCE
