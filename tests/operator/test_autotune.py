"""autotune.py and its place in decide: which layouts are tried, which one wins, and a whole tuning run."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from pd_operator import autotune, decide, layout, render
from pd_operator.actions import Create, Decision, Delete
from pd_operator.api import AutotuneStatus, AutotuneTrial, GoodputStatus, ProbeSlo
from pd_operator.command_lines import bench_command
from pd_operator.goodput import goodput_status
from pd_operator.observe import wire
from pd_operator.validation import SpecError, validate_spec
from tests.operator.podfacts import finished_job, proxy_status, running_pod, summary
from tests.operator.test_decide import T0, cond, merged, one_proxy, snapshot

MODEL = "Qwen/Qwen3-235B-A22B-FP8"
# The seed's workload: `vllm bench serve` without --ignore-eos (replies end at the model's EOS).
SEED_PROBE = {"enabled": True, "rate": 8, "promptTokens": 2000, "outputTokens": 1000, "ignoreEos": False}
RDMA = {"resourceName": "rdma/hca_shared_devices_a"}
SHORT_PROBE = {"enabled": True, "rate": 0.5, "promptTokens": 200, "outputTokens": 100, "ignoreEos": False}


def tuned_spec(probe: dict[str, Any] = SEED_PROBE, trials: int = 2, **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engine": "vllm",
        "prefill": {"shmSize": "1Gi", "resources": {"requests": {"cpu": "2"}}},
        "kvTransfer": {"rdma": RDMA},
        "goodputProbe": probe,
        "autotune": {"enabled": True, "maxTrials": trials},
        **more,
    }


def trial(name: str, kind: str, gpus: int, attainment: float | None, predicted: float = 0.5) -> AutotuneTrial:
    return AutotuneTrial(layout=name, kind=kind, gpus=gpus, predicted_attainment=predicted, attainment=attainment)  # type: ignore[arg-type]


# ---- which layouts, which winner --------------------------------------------------------------------------


def test_pick_gives_the_last_place_to_the_best_layout_of_the_other_kind() -> None:
    kinds = ["disaggregated", "disaggregated", "disaggregated", "colocated", "colocated"]
    assert autotune.pick(kinds, 1) == [0]
    assert autotune.pick(kinds, 2) == [0, 3]
    assert autotune.pick(kinds, 3) == [0, 1, 3]
    assert autotune.pick(kinds, 5) == [0, 1, 2, 3, 4]
    assert autotune.pick(["colocated", "disaggregated"], 2) == [0, 1]
    assert autotune.pick(["colocated", "colocated"], 3) == [0, 1]


def test_best_prefers_meeting_the_target_then_fewer_gpus_then_colocated() -> None:
    disagg = trial("1P TP4 + 1D TP4", "disaggregated", 8, 0.95)
    coloc = trial("2xTP4", "colocated", 8, 0.91)
    assert autotune.best([disagg, coloc], 0.9) is coloc  # both meet: colocated wins the tie
    small = trial("1P TP2 + 1D TP2", "disaggregated", 4, 0.9)
    assert autotune.best([disagg, coloc, small], 0.9) is small  # fewer GPUs first
    low = trial("2xTP4", "colocated", 8, 0.3)
    assert autotune.best([low, disagg], 0.9) is disagg
    worse = trial("1P TP4 + 1D TP4", "disaggregated", 8, 0.6)
    assert autotune.best([low, worse], 0.9) is worse  # both miss: attainment decides
    tie = trial("1xTP8", "colocated", 8, 0.6)
    assert autotune.best([worse, tie], 0.9) is tie


def test_plan_tries_disaggregated_first_for_the_seed_workload_and_colocated_too() -> None:
    trials = autotune.plan_trials(validate_spec(tuned_spec()))
    assert [t.kind for t in trials] == ["disaggregated", "colocated"]
    assert trials[0].predicted_attainment > 0.7 > trials[1].predicted_attainment
    assert all(t.gpus == 8 for t in trials)


def test_plan_tries_colocated_first_at_half_a_request_per_second_with_short_outputs() -> None:
    trials = autotune.plan_trials(validate_spec(tuned_spec(SHORT_PROBE)))
    assert [t.kind for t in trials] == ["colocated", "disaggregated"]
    assert trials[0].predicted_attainment >= 0.9 and trials[1].predicted_attainment >= 0.9


def test_the_probe_s_eos_setting_reaches_the_plan_and_the_bench() -> None:
    """With every reply at 1000 tokens the decode batches stay in step and 2xTP4 meets the SLO at 8 req/s
    (simulated); with EOS-ended replies it does not. The probe measures what the plan priced."""
    fixed = validate_spec(tuned_spec({**SEED_PROBE, "ignoreEos": True}))
    assert autotune.demand(fixed).ignore_eos and autotune.plan_trials(fixed)[0].kind == "colocated"
    eos = validate_spec(tuned_spec())
    assert not autotune.demand(eos).ignore_eos
    assert "--no-ignore-eos" in bench_command(eos, "http://x") and "--no-ignore-eos" not in bench_command(fixed, "x")
    assert autotune.workload_key(eos) != autotune.workload_key(fixed)


def test_simulated_engines_plan_in_model_time() -> None:
    """At timeScale 10 a probe at 80 req/s with 100 ms / 5 ms SLOs is the seed's 8 req/s, 1 s / 50 ms."""
    fast = {**SEED_PROBE, "rate": 80, "slo": {"ttftMs": 100, "itlMs": 5}}
    simulated = tuned_spec(fast, engine="simulated", simulation={"profile": "qwen3-235b-mi300x", "timeScale": 10})
    assert autotune.plan_trials(validate_spec(simulated)) == autotune.plan_trials(validate_spec(tuned_spec()))


def test_an_unknown_model_cannot_be_planned_and_says_so() -> None:
    spec = validate_spec({**tuned_spec(), "model": "some/model"})
    step = autotune.begin(spec, None, autotune.plan(spec))
    assert step.state is not None and step.state.trials == [] and step.state.layout_in_force is None
    assert "no calibrated profile" in step.state.message
    assert [e.reason for e in step.events] == ["AutotuneFailed"]


def test_a_node_too_small_for_the_model_cannot_be_planned_and_says_so() -> None:
    one_gpu = {"engines": [{"gpus": "0", "port": 8100, "tensorParallelSize": 1}]}
    spec = validate_spec({**tuned_spec(), "mode": "colocated", "colocated": one_gpu, "node": {"gpusPerNode": 1}})
    step = autotune.begin(spec, None, autotune.plan(spec))
    assert step.state is not None and step.state.trials == [] and step.state.layout_in_force is None
    assert step.state.message == "cannot plan the trials: no layout of the node's 1 GPUs fits the model"
    assert [e.reason for e in step.events] == ["AutotuneFailed"]


# ---- the spec in force ------------------------------------------------------------------------------------


def test_a_colocated_trial_replaces_the_layout_and_keeps_the_engine_settings() -> None:
    spec = validate_spec(tuned_spec())
    coloc = autotune.layout_spec(spec, "2xTP4")
    assert coloc.mode == "colocated"
    assert [(e.gpus, e.tensor_parallel_size, e.shm_size) for e in coloc.colocated.engines] == [
        ("0-3", 4, "1Gi"),
        ("4-7", 4, "1Gi"),
    ]
    assert coloc.colocated.engines[0].resources.requests == {"cpu": "2"}
    assert coloc.goodput_probe == spec.goodput_probe and coloc.autotune == spec.autotune


def test_an_xpyd_trial_runs_instances_in_write_mode() -> None:
    spec = validate_spec(
        {**tuned_spec(), "engineVersion": "0.34.0", "kvTransfer": {"transferMode": "read", "rdma": RDMA}}
    )
    xpyd = autotune.layout_spec(spec, "2P TP2 + 1D TP4")
    assert xpyd.kv_transfer.transfer_mode == "write"
    assert [i.gpus for i in xpyd.prefill.instances] == ["0-1", "2-3"]
    assert (xpyd.decode.gpus, xpyd.decode.tensor_parallel_size, xpyd.decode.instances) == ("4-7", 4, [])
    names = [c["name"] for c in render.pod(layout.build(layout.Owner("d", "n", "u", 1), xpyd))["spec"]["containers"]]
    assert names == ["prefill-0", "prefill-1", "decode", "proxy"]


def test_before_vllm_0_33_no_trial_changes_tp_between_prefill_and_decode() -> None:
    """0.31 cannot write KV between TP sizes: its trials never try such a layout, 0.34's may."""
    pinned = validate_spec(tuned_spec(trials=8))
    assert all(len(set(re.findall(r"TP(\d+)", t.layout))) == 1 for t in autotune.plan_trials(pinned))
    with pytest.raises(ValueError, match="does not use"):
        autotune.layout_spec(pinned, "2P TP2 + 1D TP4")
    newer = validate_spec({**tuned_spec(trials=8), "engineVersion": "0.34.0"})
    assert "2P TP2 + 1D TP4" in [t.layout for t in autotune.plan_trials(newer)]


def test_the_layout_in_force_is_the_spec_s_without_autotune_state() -> None:
    spec = validate_spec(tuned_spec())
    assert autotune.spec_in_force(spec, None) is spec
    off = validate_spec({**tuned_spec(), "autotune": {"enabled": False}})
    assert autotune.spec_in_force(off, AutotuneStatus(layout_in_force="2xTP4")) is off


# ---- recording trials ---------------------------------------------------------------------------------


def measured(attainment: float, rate: float = 8.0) -> GoodputStatus:
    spec = validate_spec(tuned_spec())
    status = goodput_status(summary(attainment, rate), spec, layout.build(layout.Owner("d", "n", "u", 1), spec))
    assert status.slo == ProbeSlo(ttft_ms=1000, itl_ms=50, target=0.9)
    return status


def two_trials() -> AutotuneStatus:
    return AutotuneStatus(
        workload="w",
        trials=[trial("1P TP4 + 1D TP4", "disaggregated", 8, None, 0.8), trial("2xTP4", "colocated", 8, None, 0.3)],
        layout_in_force="1P TP4 + 1D TP4",
        probing="1P TP4 + 1D TP4",
    )


def test_a_measured_trial_puts_the_next_in_force_and_the_last_settles() -> None:
    first = autotune.record(two_trials(), measured(0.73), None, "t1", 0.9)
    assert first.state is not None
    assert (first.state.trials[0].attainment, first.state.trials[0].goodput) == (0.73, 5.84)
    assert (first.state.layout_in_force, first.state.probing, first.state.tuned) == ("2xTP4", None, None)
    assert [e.reason for e in first.events] == ["AutotuneTrialMeasured", "AutotuneTrialStarted"]
    assert not autotune.probe_due(first.state.model_copy(update={"probing": "2xTP4"}))
    assert autotune.probe_due(first.state)
    last = autotune.record(first.state.model_copy(update={"probing": "2xTP4"}), measured(0.28), None, "t2", 0.9)
    assert last.state is not None
    assert (last.state.layout_in_force, last.state.tuned) == ("1P TP4 + 1D TP4", "1P TP4 + 1D TP4")
    assert [e.reason for e in last.events] == ["AutotuneTrialMeasured", "Tuned"]
    assert not autotune.probe_due(last.state)


def test_a_failed_trial_probe_counts_as_nothing_met_and_tuning_goes_on() -> None:
    step = autotune.record(two_trials(), None, "Job failed: DeadlineExceeded", "t1", 0.9)
    assert step.state is not None
    assert (step.state.trials[0].attainment, step.state.trials[0].error) == (0.0, "Job failed: DeadlineExceeded")
    assert step.events[0].type == "Warning" and step.state.layout_in_force == "2xTP4"


def test_a_probe_that_was_not_the_trial_s_is_not_recorded() -> None:
    stray = two_trials().model_copy(update={"probing": "2xTP4"})
    step = autotune.record(stray, measured(0.99), None, "t1", 0.9)
    assert step.state is not None and step.state.trials == stray.trials and step.state.probing is None


# ---- admission -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"replicas": 2}, "autotune.enabled needs replicas 1"),
        ({"goodputProbe": {"enabled": False}}, "autotune.enabled needs goodputProbe.enabled"),
    ],
)
def test_autotune_is_refused_without_its_preconditions(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        validate_spec({**tuned_spec(), **change})


# ---- a whole tuning run through decide ------------------------------------------------------------------


def containers(decision: Decision) -> list[str]:
    pod = next(a.obj for a in decision.actions if isinstance(a, Create) and a.obj["kind"] == "Pod")
    return [c["name"] for c in pod["spec"]["containers"]]


def test_decide_runs_each_trial_as_the_serving_layout_and_settles_on_the_best() -> None:
    spec = tuned_spec(SEED_PROBE, trials=2, engine="simulated")
    first = decide.decide(snapshot(spec))
    at = first.status.autotune
    assert at is not None and [t.kind for t in at.trials] == ["disaggregated", "colocated"]
    assert at.layout_in_force == at.trials[0].layout
    assert "AutotuneTrialStarted" in {e.reason for e in first.events}
    assert cond(wire(first.status), "Tuned")["status"] == "False"
    status, now = wire(first.status), T0
    attainments = {"disaggregated": 0.8, "colocated": 0.3}
    for number, kind in enumerate(["disaggregated", "colocated"]):
        pod = running_pod(next(a.obj for a in first.actions if isinstance(a, Create) and a.obj["kind"] == "Pod"))
        names = containers(first)
        assert "proxy" in names and ("engine-0" in names) == (kind == "colocated"), names
        ready = decide.decide(snapshot(spec, status, pods=[pod], proxies=one_proxy(status=proxy_status()), now=now))
        job = next(a.obj for a in ready.actions if isinstance(a, Create) and a.obj["kind"] == "Job")
        assert ready.status.probe.trigger == "autotune"
        assert ready.status.autotune is not None and ready.status.autotune.probing == at.trials[number].layout
        now += timedelta(seconds=30)
        done, job_pod = finished_job(job, json.dumps(summary(attainments[kind])))
        result = decide.decide(snapshot(spec, wire(ready.status), pods=[pod, job_pod], jobs=[done], now=now))
        reasons = [e.reason for e in result.events]
        assert "AutotuneTrialMeasured" in reasons
        assert ("Delete", "Pod") in {(type(a).__name__, getattr(a, "kind", "")) for a in result.actions}
        status = wire(result.status)
        # the pod of the next layout in force, created once the old one is gone
        first = decide.decide(snapshot(spec, status, now=now))
    final = first.status.autotune
    assert final is not None
    assert [t.attainment for t in final.trials] == [0.8, 0.3]
    assert final.tuned == final.trials[0].layout == final.layout_in_force
    assert cond(wire(first.status), "Tuned")["status"] == "True"
    assert "prefill" in " ".join(containers(first))
    assert not any(isinstance(a, Delete) for a in first.actions)


def test_without_autotune_there_is_no_tuned_condition_nor_autotune_status() -> None:
    decision = decide.decide(snapshot())
    assert decision.status.autotune is None
    assert "Tuned" not in {c.type for c in decision.status.conditions}


# ---- pdctl autotune accept ------------------------------------------------------------------------------


def test_accept_pins_the_tuned_layout_into_the_spec_and_turns_autotuning_off() -> None:
    stored = tuned_spec(engineVersion="0.34.0", kvTransfer={"transferMode": "read", "rdma": RDMA})
    stored["prefill"] = {
        **stored["prefill"],
        "instances": [{"gpus": "0-3", "ports": {"http": 1, "handshake": 2, "notify": 9}}],
    }
    state = AutotuneStatus(workload="w", tuned="2P TP2 + 1D TP4", layout_in_force="2P TP2 + 1D TP4")
    patch = autotune.accept_patch(stored, state)
    accepted = validate_spec(merged(stored, patch))
    expected = autotune.layout_spec(validate_spec(stored), "2P TP2 + 1D TP4")
    assert accepted.autotune.enabled is False
    assert accepted.model_copy(update={"autotune": expected.autotune}) == expected
    assert set(patch) <= {*autotune.LAYOUT_KEYS, "autotune"}
    owner = layout.Owner("d", "n", "u", 1)
    pods = [render.pod(layout.build(owner, spec)) for spec in (accepted, expected)]
    assert pods[0] == pods[1]  # the pod does not roll


def test_accept_refuses_before_tuning_is_done() -> None:
    with pytest.raises(ValueError, match="no tuned layout yet"):
        autotune.accept_patch(tuned_spec(), AutotuneStatus(workload="w", layout_in_force="2xTP4"))
