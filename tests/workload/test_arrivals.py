"""Open-loop arrivals: their spacing, and the same arrivals for the same seed and rate."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from pd_runtime.workload.arrivals import Arrival, arrival_offsets, stage_rng


def test_constant_arrivals_are_evenly_spaced() -> None:
    assert arrival_offsets(4, 8.0, Arrival.CONSTANT, random.Random(0)) == [0.0, 0.125, 0.25, 0.375]


def test_poisson_gaps_have_mean_one_over_rate() -> None:
    offsets = arrival_offsets(20001, 8.0, Arrival.POISSON, random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(1 / 8, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 8, rel=0.05)  # exponential: sd = mean


def test_arrivals_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0, Arrival.POISSON, random.Random(0))


def test_same_seed_and_rate_give_same_arrivals() -> None:
    first = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(5, 2.0, "arrivals"))
    again = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(5, 2.0, "arrivals"))
    other = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(6, 2.0, "arrivals"))
    assert first == again != other
