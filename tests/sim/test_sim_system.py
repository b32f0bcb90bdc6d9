"""The discrete-event simulation of whole deployments: the seed's qualitative claims hold, and the
calibrated profile lands within the documented tolerance of the seed's counts (docs/simulator.md)."""

from __future__ import annotations

import random
import statistics

import pytest

from pd_runtime.sim.profiles import INSTANT, QWEN3_235B_MI300X
from pd_runtime.sim.system import (
    SEED_GOOD_AT_RATE_8,
    SEED_ITL_SLO_S,
    SEED_TOPOLOGIES,
    SEED_TTFT_SLO_S,
    Topology,
    Workload,
    eos_length,
    good_count,
    poisson_arrivals,
    seed_workload,
    simulate,
)

TOLERANCE = 8  # requests of 100, mean over seeds (docs/simulator.md)
SEEDS = range(4)


@pytest.fixture(scope="module")
def mean_good() -> dict[str, float]:
    return {
        name: statistics.mean(good_count(QWEN3_235B_MI300X, name, 8.0, seed) for seed in SEEDS)
        for name in SEED_TOPOLOGIES
    }


@pytest.mark.parametrize("name", list(SEED_GOOD_AT_RATE_8))
def test_calibrated_counts_match_the_seed(mean_good: dict[str, float], name: str) -> None:
    assert abs(mean_good[name] - SEED_GOOD_AT_RATE_8[name]) <= TOLERANCE, mean_good


def test_write_beats_read_and_doubles_the_colocated_baseline(mean_good: dict[str, float]) -> None:
    assert mean_good["write"] >= mean_good["read"]
    assert mean_good["write"] >= 2 * mean_good["2xTP4"]


def test_disaggregation_removes_itl_violations_colocation_has_them() -> None:
    for name in SEED_TOPOLOGIES:
        results = simulate(QWEN3_235B_MI300X, SEED_TOPOLOGIES[name], seed_workload())
        itl_misses = sum(r.itl >= SEED_ITL_SLO_S for r in results)
        if name in ("read", "write"):
            assert itl_misses == 0, name
            assert all(r.ttft < SEED_TTFT_SLO_S for r in results[:20]), "early requests meet the TTFT SLO"
        else:
            assert itl_misses > 50, name


def test_disaggregated_attainment_is_full_at_low_rate_and_falls_past_capacity() -> None:
    for name in ("read", "write"):
        assert good_count(QWEN3_235B_MI300X, name, 4.0, 0) >= 98
        assert good_count(QWEN3_235B_MI300X, name, 10.0, 0) < 60


def test_instant_profile_has_no_latency() -> None:
    workload = Workload(rate=50.0, requests=20, prompt_tokens=100, output_tokens=5)
    for kind in ("colocated", "write", "read"):
        results = simulate(INSTANT, Topology(kind), workload)
        assert all(r.ttft == pytest.approx(0.0) and r.itl == 0.0 for r in results)


def test_simulation_is_deterministic() -> None:
    a = simulate(QWEN3_235B_MI300X, SEED_TOPOLOGIES["write"], seed_workload(seed=3))
    b = simulate(QWEN3_235B_MI300X, SEED_TOPOLOGIES["write"], seed_workload(seed=3))
    assert [r.token_times for r in a] == [r.token_times for r in b]


def test_arrivals() -> None:
    times = poisson_arrivals(8.0, 100, random.Random(1), rescaled=True)
    assert times[0] == 0.0 and times[-1] == pytest.approx(100 / 8.0)
    assert times == sorted(times)


def test_eos_length_is_capped_and_never_the_first_token() -> None:
    rng = random.Random(0)
    draws = [eos_length(100.0, 1000, rng) for _ in range(2000)]
    assert min(draws) >= 2 and max(draws) <= 1000
    assert 80 < statistics.mean(draws) < 125
    assert eos_length(0.0, 1000, rng) == 1000


MIX = ((200, 0.7), (2000, 0.3))


def test_a_mixed_workload_draws_each_prompt_length_by_its_share_and_keeps_the_arrivals() -> None:
    mixed = Workload(rate=4.0, requests=1000, prompt_mix=MIX, seed=1)
    lengths = mixed.prompt_lengths(1000)
    assert set(lengths) == {200, 2000} and 650 <= lengths.count(200) <= 750
    assert lengths == mixed.prompt_lengths(1000)  # the same draw for the same seed and rate
    few = Workload(rate=4.0, requests=50, output_tokens=10, prompt_mix=MIX, seed=1)
    plain = Workload(rate=4.0, requests=50, output_tokens=10, seed=1)
    assert [r.arrival for r in simulate(INSTANT, Topology("write"), few)] == [
        r.arrival for r in simulate(INSTANT, Topology("write"), plain)
    ]


def test_a_prompt_served_on_decode_alone_costs_what_a_colocated_engine_pays() -> None:
    """Below the threshold a request is one plain request to decode: token for token what a colocated
    engine of decode's shape does with it."""
    workload = Workload(rate=2.0, requests=50, prompt_mix=MIX, output_tokens=100, seed=2)
    decode = Topology("write").decode
    alone = simulate(QWEN3_235B_MI300X, Topology("write", decode_alone_below=10**9), workload)
    colocated = simulate(QWEN3_235B_MI300X, Topology("colocated", engine=decode), workload)
    assert [r.token_times for r in alone] == [r.token_times for r in colocated]


def test_a_threshold_serves_short_prompts_sooner_and_leaves_long_ones_disaggregated() -> None:
    workload = Workload(rate=1.0, requests=100, prompt_mix=MIX, output_tokens=200, seed=3)
    short = [p == 200 for p in workload.prompt_lengths(100)]
    always = simulate(QWEN3_235B_MI300X, Topology("write"), workload)
    threshold = simulate(QWEN3_235B_MI300X, Topology("write", decode_alone_below=512), workload)
    ttft = {
        name: statistics.median(r.ttft for r, s in zip(results, short, strict=True) if s)
        for name, results in (("always", always), ("threshold", threshold))
    }
    assert ttft["threshold"] < ttft["always"]  # no prefill leg, no KV transfer
    assert statistics.mean(r.itl for r in threshold) > statistics.mean(r.itl for r in always)  # prefills on decode
