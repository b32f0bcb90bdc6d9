"""spec.autotune end to end: the operator tries the planner's layouts with the goodput probe and keeps the best.

On the simulated profile of the seed's node (qwen3-235b-mi300x), at time scale 2 (where the Python
processes keep up with the modelled steps, docs/simulator.md), two deployments tune at once with a
budget of two trials each: the seed's workload at 8 req/s (100 requests, 2000-token prompts, replies of
at most 1000 tokens ending at EOS; disaggregation wins by a wide margin: colocated layouts miss the ITL
SLO on most requests) and 0.5 req/s with 200-token prompts
and 100-token outputs (every layout meets the SLO, so the tie goes to colocated). Probe rates and SLOs
are in wall time: the model-time workload times the scale, the SLOs divided by it.

Which layout wins is a claim about latencies, so it is asserted in virtual time: the planner's predicted
attainments (the simulator's discrete-event model) that the operator records with each trial. The
probes measure in wall time, which a loaded machine slows; of them the tests assert only that the
operator kept the trial its own rule (``autotune.best``) ranks first by what was measured.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import Obj, apply, condition, create_namespace, get, pdd, pod, wait_for
from e2e.tests.test_pddeployment import load_example
from pd_operator.api import AutotuneTrial
from pd_operator.autotune import best
from pd_operator.validation import validate_spec

log = logging.getLogger(__name__)
TIME_SCALE = 2
NAMESPACE = "pd-autotune"
CASES = {
    # name: (model-time rate, prompt tokens, output tokens, probe requests, the kind that must win)
    "tune-seed": (8.0, 2000, 1000, 100, "disaggregated"),
    "tune-short": (0.5, 200, 100, 10, "colocated"),
}


def manifest(name: str) -> Obj:
    rate, prompt, output, requests, _ = CASES[name]
    obj = load_example("write", name)
    spec = obj["spec"]
    spec["simulation"] = {"profile": "qwen3-235b-mi300x", "timeScale": TIME_SCALE}
    spec["goodputProbe"] = {
        "enabled": True,
        "rate": rate * TIME_SCALE,
        "requests": requests,
        "promptTokens": prompt,
        "outputTokens": output,
        "slo": {"ttftMs": 1000 / TIME_SCALE, "itlMs": 50 / TIME_SCALE},
        "ignoreEos": False,  # the seed's `vllm bench serve` without --ignore-eos
        "seed": 3,
        "timeoutSeconds": 300,
    }
    spec["autotune"] = {"enabled": True, "maxTrials": 2}
    return obj


@pytest.fixture(scope="module")
def tuning(operator: Stack) -> Iterator[str]:
    cp = operator.cp
    create_namespace(cp, NAMESPACE)
    for name in CASES:
        apply(cp, json.dumps(manifest(name)), NAMESPACE)
    yield NAMESPACE
    cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def events(cp: ControlPlane, name: str, reason: str) -> list[Obj]:
    selector = f"involvedObject.kind=PDDeployment,involvedObject.name={name},reason={reason}"
    listing = get(cp, f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={selector}") or {}
    found: list[Obj] = listing.get("items", [])
    return found


def tuned(cp: ControlPlane, name: str) -> Obj | None:
    obj = pdd(cp, NAMESPACE, name)
    return obj if (condition(obj, "Tuned") or {}).get("status") == "True" else None


@pytest.mark.parametrize("name", list(CASES))
def test_autotune_chooses_a_layout_and_records_its_trials(cp: ControlPlane, tuning: str, name: str) -> None:
    obj = wait_for(lambda: tuned(cp, name), 600, f"condition Tuned of {name}", interval_s=2)
    state = obj["status"]["autotune"]
    table = [
        (t["layout"], t["kind"], t.get("predictedAttainment"), t.get("attainment"), t.get("goodput"))
        for t in state["trials"]
    ]
    log.info("%s: tuned %s; trials (layout, kind, predicted, measured, goodput req/s): %s", name, state["tuned"], table)
    trials = state["trials"]
    assert len(trials) == 2 and {t["kind"] for t in trials} == {"colocated", "disaggregated"}, trials
    assert all(t.get("attainment") is not None and t.get("time") and not t.get("error") for t in trials), trials
    winner = next(t for t in trials if t["layout"] == state["tuned"])
    target = validate_spec(obj["spec"]).goodput_probe.slo.target
    assert best([AutotuneTrial.model_validate(t) for t in trials], target).layout == state["tuned"], table
    predicted = sorted(trials, key=lambda t: (-t["predictedAttainment"], t["kind"] != "colocated"))
    if CASES[name][4] == "disaggregated":  # the planner: disaggregation wins by a wide margin
        assert predicted[0]["kind"] == "disaggregated", table
        assert predicted[0]["predictedAttainment"] >= predicted[1]["predictedAttainment"] + 0.3, table
    else:  # the planner: every layout meets the target, so the tie goes to colocated
        assert all(t["predictedAttainment"] >= target for t in trials), table
    assert state["layoutInForce"] == state["tuned"]
    serving = wait_for(lambda: _current_pod(cp, obj), 120, f"the serving pod of {state['tuned']}")
    containers = [c["name"] for c in serving["spec"]["containers"]]
    assert ("engine-0" in containers) == (winner["kind"] == "colocated"), containers
    assert len(events(cp, name, "AutotuneTrialMeasured")) == 2
    assert events(cp, name, "Tuned")


def _current_pod(cp: ControlPlane, obj: Obj) -> Obj | None:
    """The serving pod once it runs the tuned layout and is ready (the last trial may have been another)."""
    fresh = pdd(cp, NAMESPACE, obj["metadata"]["name"]) or {}
    status = fresh.get("status") or {}
    found = pod(cp, NAMESPACE, status.get("podName") or "")
    return found if status.get("phase") == "Ready" and status.get("updatedReplicas") == 1 else None


def test_accept_pins_the_tuned_layout_without_rolling_the_pod(cp: ControlPlane, tuning: str) -> None:
    name = "tune-seed"
    obj = wait_for(lambda: tuned(cp, name), 600, f"condition Tuned of {name}", interval_s=2)
    before = wait_for(lambda: _current_pod(cp, obj), 120, "the serving pod of the tuned layout")
    pdctl = Path(sys.prefix) / "bin" / "pdctl"
    done = subprocess.run(
        [str(pdctl), "autotune", "accept", name, "-n", NAMESPACE], env=cp.env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    state = obj["status"]["autotune"]
    kind = next(t["kind"] for t in state["trials"] if t["layout"] == state["tuned"])
    spec = (pdd(cp, NAMESPACE, name) or {})["spec"]
    assert spec["autotune"]["enabled"] is False
    assert (spec.get("mode", "disaggregated") == "disaggregated") == (kind == "disaggregated"), spec
    settled = wait_for(lambda: _current_pod(cp, obj), 60, "the pod after accept")
    assert settled["metadata"]["uid"] == before["metadata"]["uid"]
