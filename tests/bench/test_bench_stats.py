"""Percentiles and the Wilson interval against independently known values."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pd_runtime.bench.stats import EMPTY, percentile, summarize, wilson_interval


def test_percentile_matches_numpy_linear_method() -> None:
    rng = random.Random(7)
    for size in (1, 2, 3, 10, 100, 101):
        values = [rng.uniform(0, 1000) for _ in range(size)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_hand_computed_list() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20], 90) == pytest.approx(19.0)


@pytest.mark.parametrize("q", [-1, 101])
def test_percentile_rejects_out_of_range(q: float) -> None:
    with pytest.raises(ValueError):
        percentile([1.0], q)


def test_summarize_empty_is_all_null() -> None:
    assert summarize([]) == EMPTY
    assert EMPTY.as_dict() == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_summarize() -> None:
    dist = summarize([float(v) for v in range(1, 101)])
    assert dist.p50 == pytest.approx(50.5)
    assert dist.p99 == pytest.approx(99.01)
    assert dist.mean == pytest.approx(50.5)


@pytest.mark.parametrize(
    ("good", "n", "low", "high"),
    [
        (50, 100, 0.4038, 0.5962),  # textbook value for p = 0.5, n = 100
        (0, 10, 0.0, 0.2775),  # z^2 / (n + z^2)
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_known_values(good: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(good, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_wilson_is_symmetric_and_contains_the_estimate() -> None:
    for n in (1, 7, 100):
        for good in range(n + 1):
            lo, hi = wilson_interval(good, n)
            assert 0 <= lo <= good / n <= hi <= 1
            mirrored = wilson_interval(n - good, n)
            assert mirrored[0] == pytest.approx(1 - hi) and mirrored[1] == pytest.approx(1 - lo)


def test_wilson_without_trials_knows_nothing() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
