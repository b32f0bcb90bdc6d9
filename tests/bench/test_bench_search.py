"""The goodput search on synthetic attainment curves, and sweep parsing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pd_runtime.bench.search import Probe, SearchParams, bracket, next_search_rate, parse_sweep


def run_search(params: SearchParams, curve: Callable[[float], float]) -> list[Probe]:
    probes: list[Probe] = []
    while (rate := next_search_rate(params, probes)) is not None:
        probes.append(Probe(rate, curve(rate)))
    return probes


def seed_like_curve(rate: float) -> float:
    """100 % up to 5.6 req/s, then falling (the shape of the seed's write-mode curve)."""
    return 1.0 if rate <= 5.6 else max(0.0, 1.0 - 0.15 * (rate - 5.6))


@pytest.mark.parametrize("start", [0.5, 1.0, 8.0, 40.0])
def test_search_finds_the_crossing_within_tolerance(start: float) -> None:
    params = SearchParams(start_rate=start, target=0.9, rel_tolerance=0.05)
    probes = run_search(params, seed_like_curve)
    found = bracket(probes, 0.9)
    assert found.passing is not None and found.failing is not None
    true_goodput = 5.6 + 0.1 / 0.15  # attainment falls to 0.9 here
    assert found.passing <= true_goodput < found.failing
    assert found.failing - found.passing <= 0.05 * found.passing
    assert probes[0].rate == start
    assert len(probes) <= params.max_probes


def test_search_when_everything_passes_stops_at_the_span() -> None:
    params = SearchParams(start_rate=1.0, target=0.9, span=16)
    probes = run_search(params, lambda rate: 1.0)
    assert [p.rate for p in probes] == [1, 2, 4, 8, 16]
    assert bracket(probes, 0.9).passing == 16 and bracket(probes, 0.9).failing is None


def test_search_when_nothing_passes_reports_no_goodput() -> None:
    params = SearchParams(start_rate=8.0, target=0.9, span=8)
    probes = run_search(params, lambda rate: 0.5)
    assert [p.rate for p in probes] == [8, 4, 2, 1]
    assert bracket(probes, 0.9).passing is None


def test_search_respects_max_probes() -> None:
    params = SearchParams(start_rate=1.0, target=0.9, rel_tolerance=1e-9, max_probes=6)
    assert len(run_search(params, seed_like_curve)) == 6


def test_bracket_ignores_passing_rates_above_a_failure() -> None:
    """A noisy curve that dips at 4 and recovers at 6 does not sustain 6."""
    probes = [Probe(2, 0.95), Probe(4, 0.85), Probe(6, 0.92)]
    found = bracket(probes, 0.9)
    assert found.passing == 2 and found.failing == 4


def test_target_is_inclusive() -> None:
    assert bracket([Probe(3, 0.9)], 0.9).passing == 3


def test_parse_sweep_of_the_seed_figure() -> None:
    rates = parse_sweep("0.5:10:0.5")
    assert len(rates) == 20
    assert rates[0] == 0.5 and rates[-1] == 10.0 and rates[2] == 1.5


def test_parse_sweep_single_rate() -> None:
    assert parse_sweep("2:2:1") == [2.0]


@pytest.mark.parametrize("spec", ["1:2", "a:b:c", "0:1:0.5", "2:1:0.5", "1:2:0", "1:2:-1", "0.001:10000:0.001"])
def test_parse_sweep_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_sweep(spec)
