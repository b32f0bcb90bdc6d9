"""The autoscaling core: demand, capacity and the scaling decision, pure and in virtual time."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from pd_operator import autoscale, layout
from pd_operator.api import (
    AutoscalingSpec,
    DemandStatus,
    GoodputProbeSpec,
    GoodputStatus,
    LatencyStats,
    PDDeploymentSpec,
    ProbeMeasured,
    ProbeSlo,
    ScaleRecommendation,
)
from pd_operator.autoscale import Predictions, ProxyDemand, Replicas
from pd_operator.goodput import rfc3339
from pd_operator.validation import SpecError, validate_spec
from pd_runtime.plan.layouts import NodeLayout

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = AutoscalingSpec(
    enabled=True,
    min_replicas=1,
    max_replicas=4,
    target_utilization=0.8,
    scale_up_stabilization_seconds=60,
    scale_down_stabilization_seconds=300,
)


def _demand(rate: float, prompt: float | None = 2000, output: float | None = 1000) -> DemandStatus:
    return DemandStatus(
        requests_per_second=rate,
        in_flight=0,
        queued=0,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        window_seconds=30,
        replicas_reporting=1,
        time=rfc3339(T0),
    )


def goodput_status(rate: float | None) -> GoodputStatus:
    return GoodputStatus(
        time=rfc3339(T0),
        rate=8,
        requests=100,
        good=95,
        errors=0,
        attainment=0.95,
        ttft_ms=LatencyStats(),
        itl_ms=LatencyStats(),
        goodput_rate=rate,
        slo=ProbeSlo(ttft_ms=1000, itl_ms=50, target=0.9),
        met=True,
        measured=ProbeMeasured(
            mode="disaggregated", transfer_mode="write", engine="simulated", gpu_split="", generation=1
        ),
        summary="95% @8/s",
    )


def _capacity(rate: float) -> autoscale.CapacityStatus:
    found = autoscale.capacity(SPEC, GoodputProbeSpec(), goodput_status(rate), None, Predictions(None, None), T0)
    assert found is not None
    return found


def test_demand_sums_rates_and_weighs_the_means_by_requests() -> None:
    reports = [
        ProxyDemand(6.0, 3, 1, 30, prompt_requests=10, prompt_tokens=10_000, output_requests=10, output_tokens=5_000),
        ProxyDemand(4.5, 2, 0, 30, prompt_requests=30, prompt_tokens=90_000, output_requests=20, output_tokens=15_000),
    ]
    got = autoscale.demand(reports, T0)
    assert got is not None
    assert (got.requests_per_second, got.in_flight, got.queued, got.replicas_reporting) == (10.5, 5, 1, 2)
    assert got.mean_prompt_tokens == 2500.0 and got.mean_output_tokens == 666.7
    assert got.summary == "10.5/s"
    assert autoscale.demand([], T0) is None


def test_a_replica_started_within_the_window_adds_its_arrivals_not_its_short_lived_rate() -> None:
    """3 req/s for 30 s over two old replicas; a third, up 10 s ago, took a third of the last 5 s."""
    old = [ProxyDemand(1.45, 1, 0, 30, arrivals=43), ProxyDemand(1.45, 1, 0, 30, arrivals=42)]
    new = ProxyDemand(0.5, 1, 0, 10, arrivals=5)  # 5 requests over its 10 s of life
    got = autoscale.demand([*old, new], T0)
    assert got is not None and got.requests_per_second == 3.0  # (43 + 42 + 5) / 30, not 3.4 summed
    mixed = autoscale.demand([*old, ProxyDemand(0.5, 1, 0, 10)], T0)  # one older proxy: the rates summed
    assert mixed is not None and mixed.requests_per_second == 3.4


def test_demand_without_known_lengths_has_no_means() -> None:
    got = autoscale.demand([ProxyDemand(2.0, 0, 0, 30)], T0)
    assert got is not None and got.mean_prompt_tokens is None and got.mean_output_tokens is None


def test_a_proxy_status_document_becomes_a_report_or_nothing() -> None:
    status = {
        "demand": {
            "window_s": 30,
            "requests_per_second": 2.5,
            "arrivals": 75,
            "in_flight": 4,
            "queued": 1,
            "output_tokens": {"requests": 75, "sum": 75_000},
            "prompt_tokens": {"requests": 70, "sum": 140_000},
        }
    }
    assert ProxyDemand.from_status(status) == ProxyDemand(2.5, 4, 1, 30.0, 70, 140_000, 75, 75_000, arrivals=75)
    del status["demand"]["arrivals"]  # an older proxy
    assert ProxyDemand.from_status(status) == ProxyDemand(2.5, 4, 1, 30.0, 70, 140_000, 75, 75_000)
    assert ProxyDemand.from_status({}) is None
    assert ProxyDemand.from_status({"demand": {"requests_per_second": "fast"}}) is None
    assert ProxyDemand.from_status({"demand": []}) is None


def test_capacity_is_measured_while_the_workload_looks_like_the_probes() -> None:
    got = autoscale.capacity(
        SPEC, GoodputProbeSpec(), goodput_status(8.9), _demand(5, 2400, 900), Predictions(7.0, 6.0), T0
    )
    assert got is not None
    assert (got.source, got.requests_per_second, got.stale, got.summary) == ("measured", 8.9, False, "8.9/s measured")


def test_capacity_is_scaled_from_the_planner_once_the_workload_moved() -> None:
    # Prompts 4x the probe's: the planner says 3.5/s there and 7/s at the probe's, measured 8.9/s at the probe's.
    got = autoscale.capacity(
        SPEC, GoodputProbeSpec(), goodput_status(8.9), _demand(5, 8000, 1000), Predictions(7.0, 3.5), T0
    )
    assert got is not None
    assert got.source == "scaled" and got.stale
    assert got.requests_per_second == pytest.approx(3.5 * 8.9 / 7.0, abs=1e-3)
    assert got.prompt_tokens == 8000


def test_stale_measured_capacity_without_a_prediction_says_stale() -> None:
    got = autoscale.capacity(
        SPEC, GoodputProbeSpec(), goodput_status(8.9), _demand(5, 200, 1000), Predictions(None, None), T0
    )
    assert got is not None and got.source == "measured" and got.stale


def test_capacity_is_predicted_without_a_search_and_none_without_either() -> None:
    got = autoscale.capacity(SPEC, GoodputProbeSpec(), goodput_status(None), None, Predictions(6.0, None), T0)
    assert got is not None and got.source == "predicted" and got.requests_per_second == 6.0
    assert autoscale.capacity(SPEC, GoodputProbeSpec(), None, None, Predictions(None, None), T0) is None


@pytest.mark.parametrize(("rate", "expected"), [(0.0, 1), (7.12, 1), (7.13, 2), (21.3, 3), (21.4, 4), (1000.0, 4)])
def test_recommend_is_demand_over_target_times_capacity_within_bounds(rate: float, expected: int) -> None:
    assert autoscale.recommend(SPEC, rate, 8.9) == expected


def _ramp(rates: list[tuple[int, float]], start: int = 1, available: bool = True) -> list[tuple[int, int, str]]:
    """Drive the core over (second, demand) points in virtual time, applying each decision at once."""
    history: tuple[ScaleRecommendation, ...] = ()
    replicas, seen = start, []
    for second, rate in rates:
        now = T0 + timedelta(seconds=second)
        verdict = autoscale.decide(
            SPEC,
            Replicas(spec=replicas, available=replicas if available else 0),
            _demand(rate),
            _capacity(8.9),
            history,
            now,
        )
        history = verdict.recommendations
        if verdict.replicas is not None:
            replicas = verdict.replicas
        seen.append((second, replicas, verdict.reason))
    return seen


def test_a_sustained_rise_scales_up_after_the_up_window_and_a_burst_does_not() -> None:
    burst = _ramp([(t, 20.0 if 10 <= t < 40 else 3.0) for t in range(0, 200, 5)])
    assert {replicas for _, replicas, _ in burst} == {1}
    rise = _ramp([(t, 20.0) for t in range(0, 120, 5)])
    first_up = next(t for t, replicas, _ in rise if replicas > 1)
    assert first_up == 60  # every recommendation of the 60 s window says 3 from t=60 on (t=0 is in it)
    assert rise[-1][1] == 3


def test_a_drop_scales_down_one_replica_at_a_time_after_the_down_window() -> None:
    seen = _ramp([(t, 2.0) for t in range(0, 700, 15)], start=3)
    before = [3] + [replicas for _, replicas, _ in seen]
    changes = [(t, replicas) for (t, replicas, _), prior in zip(seen, before, strict=False) if replicas != prior]
    assert changes == [(300, 2), (315, 1)]


def test_no_scale_down_while_a_replica_is_not_available() -> None:
    seen = _ramp([(t, 2.0) for t in range(0, 700, 15)], start=3, available=False)
    assert {replicas for _, replicas, _ in seen} == {3}
    assert seen[-1][2] == "WaitingForReplicas"


def test_replicas_still_starting_count_as_coming() -> None:
    # 3 asked for, 1 available: demand that 3 hold asks for nothing more, whatever the queue says.
    verdict = autoscale.decide(SPEC, Replicas(spec=3, available=1), _demand(20.0), _capacity(8.9), (), T0)
    assert verdict.replicas is None and verdict.reason == "DemandWithinCapacity"


def test_the_event_says_why() -> None:
    history = tuple(ScaleRecommendation(time=rfc3339(T0 + timedelta(seconds=s)), replicas=4) for s in range(0, 61, 20))
    verdict = autoscale.decide(
        SPEC, Replicas(spec=3, available=3), _demand(21.5), _capacity(8.9), history, T0 + timedelta(seconds=61)
    )
    assert verdict.replicas == 4 and verdict.reason == "ScaledUp"
    assert verdict.event == "demand 21.5 req/s > 0.8 x 3 x 8.9 req/s: replicas 3 -> 4"


def test_replicas_outside_the_bounds_come_back_at_once() -> None:
    verdict = autoscale.decide(SPEC, Replicas(spec=9, available=9), _demand(1.0), _capacity(8.9), (), T0)
    assert verdict.replicas == 4 and verdict.reason == "ScaledToBounds"
    blind = autoscale.decide(SPEC.model_copy(update={"min_replicas": 2}), Replicas(1, 1), None, None, (), T0)
    assert (blind.replicas, blind.reason, blind.event) == (2, "ScaledToBounds", "replicas 1 outside [2, 4]: 1 -> 2")


def test_another_owner_of_replicas_or_missing_inputs_stop_it_with_a_reason() -> None:
    owned = autoscale.decide(SPEC, Replicas(1, 1, hpa="web"), _demand(30.0), _capacity(8.9), (), T0)
    assert (owned.replicas, owned.status, owned.reason) == (None, "False", "ReplicasOwnedElsewhere")
    assert "HorizontalPodAutoscaler web" in owned.message
    # It still decides as if it owned replicas and publishes that for the HPA (pd_operator_desired_replicas).
    assert owned.advised == 1 and "desired replicas 1 (DemandWithinCapacity)" in owned.message  # the up window
    later = autoscale.decide(
        SPEC,
        Replicas(1, 1, hpa="web"),
        _demand(30.0),
        _capacity(8.9),
        owned.recommendations,
        T0 + timedelta(seconds=61),
    )
    assert later.advised == 4 and later.desired(1) == 4 and "desired replicas 4 (ScaledUp)" in later.message
    assert [r.replicas for r in later.recommendations] == [4] and later.replicas is None
    bounded = autoscale.decide(SPEC, Replicas(6, 6, hpa="web"), None, None, (), T0)
    assert (bounded.replicas, bounded.advised, bounded.reason) == (None, 4, "ReplicasOwnedElsewhere")
    idle = autoscale.decide(SPEC, Replicas(2, 2, hpa="web"), None, None, (), T0)
    assert (idle.advised, idle.desired(2)) == (2, 2) and "(NoCapacity)" in idle.message
    blind = autoscale.decide(SPEC, Replicas(1, 1), _demand(30.0), None, (), T0)
    assert (blind.replicas, blind.reason) == (None, "NoCapacity")
    deaf = autoscale.decide(SPEC, Replicas(1, 1), None, _capacity(8.9), (), T0)
    assert (deaf.replicas, deaf.reason) == (None, "NoDemand")


def test_the_history_is_a_step_function_bounded_by_the_longest_window_and_count() -> None:
    flat = tuple(ScaleRecommendation(time=rfc3339(T0 + timedelta(seconds=s)), replicas=1) for s in (0, 100))
    verdict = autoscale.decide(SPEC, Replicas(1, 1), _demand(1.0), _capacity(8.9), flat, T0 + timedelta(seconds=200))
    assert verdict.recommendations == flat  # the same value again adds no entry
    noisy = tuple(
        ScaleRecommendation(time=rfc3339(T0 + timedelta(seconds=s)), replicas=1 + s % 2) for s in range(0, 1000)
    )
    verdict = autoscale.decide(SPEC, Replicas(1, 1), _demand(1.0), _capacity(8.9), noisy, T0 + timedelta(seconds=1000))
    assert len(verdict.recommendations) == autoscale.MAX_RECOMMENDATIONS
    assert verdict.recommendations[-1] == ScaleRecommendation(time=rfc3339(T0 + timedelta(seconds=1000)), replicas=1)


def test_a_history_that_no_longer_covers_the_window_only_makes_it_more_cautious() -> None:
    # Only the last 64 changes are kept: the window then opens at the current replicas, so no scale-down.
    noisy = tuple(
        ScaleRecommendation(time=rfc3339(T0 + timedelta(seconds=s)), replicas=1 + s % 2) for s in range(700, 1000)
    )
    verdict = autoscale.decide(
        SPEC, Replicas(3, 3), _demand(1.0), _capacity(8.9), noisy[-64:], T0 + timedelta(seconds=1000)
    )
    assert verdict.replicas is None


def test_the_spec_refuses_contradictions() -> None:
    base = {"model": "m", "engine": "simulated"}
    with pytest.raises(SpecError, match="minReplicas must not exceed"):
        validate_spec({**base, "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}})
    with pytest.raises(SpecError, match="exclude each other"):
        validate_spec(
            {**base, "goodputProbe": {"enabled": True}, "autotune": {"enabled": True}, "autoscaling": {"enabled": True}}
        )
    assert isinstance(validate_spec({**base, "autoscaling": {"enabled": True}}), PDDeploymentSpec)


def test_capacity_says_where_it_comes_from_and_the_ratio_it_scaled_by() -> None:
    fresh = autoscale.capacity(SPEC, GoodputProbeSpec(), goodput_status(8.9), None, Predictions(7.0, None), T0)
    assert fresh is not None and fresh.message == "goodput search at 2000/1000 tokens"
    scaled = autoscale.capacity(
        SPEC, GoodputProbeSpec(), goodput_status(8.9), _demand(5, 8000, 1000), Predictions(7.0, 3.5), T0
    )
    assert scaled is not None and scaled.measured_over_predicted == pytest.approx(8.9 / 7.0, abs=1e-3)
    assert scaled.message == (
        "the workload moved to 8000/1000 tokens from the probe's 2000/1000 tokens: "
        "the planner's 3.5/s for it x measured/predicted 8.9/7"
    )
    kept = autoscale.capacity(
        SPEC, GoodputProbeSpec(), goodput_status(8.9), _demand(5, 8000, 1000), Predictions(7.0, None), T0
    )
    assert kept is not None and kept.stale and "kept the measured rate" in kept.message


def test_an_event_only_when_the_capacitys_basis_changes() -> None:
    probe, moved = GoodputProbeSpec(), _demand(5, 8000, 1000)
    measured = autoscale.capacity(SPEC, probe, goodput_status(8.9), None, Predictions(7.0, None), T0)
    scaled = autoscale.capacity(SPEC, probe, goodput_status(8.9), moved, Predictions(7.0, 3.5), T0)
    stale = autoscale.capacity(SPEC, probe, goodput_status(8.9), moved, Predictions(None, None), T0)
    predicted = autoscale.capacity(SPEC, probe, None, None, Predictions(6.0, None), T0)
    assert autoscale.capacity_event(measured, measured) is None and autoscale.capacity_event(measured, None) is None
    assert [
        autoscale.capacity_event(before, after)[0]
        for before, after in ((None, predicted), (predicted, measured), (measured, scaled), (scaled, stale))
    ] == [  # type: ignore[index]
        "CapacityPredicted",
        "CapacityMeasured",
        "CapacityScaled",
        "CapacityStale",
    ]
    _, message = autoscale.capacity_event(measured, scaled) or ("", "")
    assert message.startswith("capacity 4.45 req/s per replica (scaled): the workload moved to 8000/1000 tokens")


def _layout(spec: dict[str, object]) -> tuple[PDDeploymentSpec, layout.Layout]:
    checked = PDDeploymentSpec.model_validate(spec)
    return checked, layout.build(layout.Owner(name="x"), checked)


SIM = {
    "model": "Qwen/Qwen3-235B-A22B-FP8",
    "engine": "simulated",
    "simulation": {"profile": "qwen3-235b-mi300x", "timeScale": 10},
    "prefill": {"gpus": "0-3"},
    "decode": {"gpus": "4-7"},
    "goodputProbe": {"enabled": True, "promptTokens": 200, "outputTokens": 20},
    "autoscaling": {"enabled": True},
}


def test_the_planner_is_asked_about_the_probes_workload_and_a_moved_live_one() -> None:
    spec, lay = _layout(SIM)
    assert autoscale.plan_layout(lay) == NodeLayout("disaggregated", 1, 4, 1, 4)
    probe, live = autoscale.queries(spec, lay, _demand(5, 210, 19))  # like the probe's: no live question
    assert probe is not None and live is None and probe.time_scale == 10
    assert (probe.demand.prompt_tokens, probe.demand.output_tokens) == (200, 20)
    probe, live = autoscale.queries(spec, lay, _demand(5, 4321.0, 19))
    assert live is not None and (live.demand.prompt_tokens, live.demand.output_tokens) == (4300, 19)  # 2 digits
    silent, _ = _layout({**SIM, "goodputProbe": {"enabled": False}})  # no SLO of the user's: nothing to ask
    assert autoscale.queries(silent, lay, None) == (None, None)
    colocated = {
        **SIM,
        "mode": "colocated",
        "colocated": {"engines": [{"gpus": "0-3", "port": 8100}, {"gpus": "4-7", "port": 8200}]},
    }
    del colocated["prefill"], colocated["decode"]
    assert autoscale.plan_layout(_layout(colocated)[1]) == NodeLayout("colocated", engines=2, engine_tp=4)


def test_the_planners_capacity_falls_with_longer_prompts_and_is_none_for_an_unknown_model() -> None:
    spec, lay = _layout(SIM)
    probe, live = autoscale.queries(spec, lay, _demand(5, 2000, 20))
    assert probe is not None and live is not None
    short, long = autoscale.predictions(probe, live).probe_workload, autoscale.predict(live)
    assert short is not None and long is not None and 0 < long < short
    assert autoscale.predict(live) == long  # deterministic (and cached)
    unknown = dataclasses.replace(probe, model="nobody/unknown-model")
    assert autoscale.predict(unknown) is None
