"""A refused engine preflight reaches the PDDeployment: its reason in a condition, an Event and the roles."""

from __future__ import annotations

from typing import Any

from pd_operator import layout, observe, render
from pd_operator.api import Condition, PDDeploymentSpec, PDDeploymentStatus
from pd_operator.observe import Observation, ReplicaObservation
from pd_operator.validation import validate_spec
from pd_operator.views import pod_view
from pd_runtime import launcher
from tests.operator.podfacts import container_status, running_pod

OWNER = layout.Owner(name="demo", namespace="ns1", uid="uid-1", generation=2)
SIM = validate_spec({"model": "m", "engine": "simulated"})
COLOCATED = validate_spec({"model": "m", "engine": "simulated", "mode": "colocated"})
NOW = "2026-11-29T08:00:00Z"
REFUSAL = (
    "pdctl engine: preflight failed for the prefill engine:\n"
    "- backend rdma, but the container has no /dev/infiniband/uverbs* device: request the RDMA device-plugin "
    "resource\n"
)
BACK_OFF = "back-off 10s restarting failed container=prefill pod=demo_ns1"


def crash_looping(name: str, exit_code: int, message: str) -> dict[str, Any]:
    """As the kubelet reports a container between restarts: waiting, with the last run's termination."""
    status = container_status(name, ready=False, restarts=2)
    status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": BACK_OFF}}
    status["lastState"] = {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}}
    return status


def observed(
    spec: PDDeploymentSpec, statuses: list[dict[str, Any]], previous: PDDeploymentStatus | None = None
) -> PDDeploymentStatus:
    lay = layout.build(OWNER, spec)
    pod = pod_view(running_pod(render.pod(lay), statuses=statuses))
    prior = previous or PDDeploymentStatus()
    replicas = (ReplicaObservation(0, pod),)
    return observe.status(Observation(generation=2, now=NOW, spec=spec, layout=lay, replicas=replicas, previous=prior))


def cond(status: PDDeploymentStatus, kind: str) -> Condition:
    found = observe.find(status.conditions, kind)
    assert found is not None
    return found


def test_the_operator_knows_the_launchers_exit_code() -> None:
    assert observe.PREFLIGHT_EXIT_CODE == launcher.EXIT_PREFLIGHT_FAILED


def test_refused_prefill_shows_the_reason_in_condition_roles_phase_and_one_event() -> None:
    statuses = [crash_looping("prefill", 78, REFUSAL), container_status("decode"), container_status("proxy")]
    before = observed(SIM, [container_status(n, ready=False) for n in ("prefill", "decode", "proxy")])
    after = observed(SIM, statuses, previous=before)
    prefill_ready = cond(after, "PrefillReady")
    assert (prefill_ready.status, prefill_ready.reason) == ("False", "PreflightFailed")
    assert prefill_ready.message.startswith("prefill: pdctl engine: preflight failed")
    assert "no /dev/infiniband/uverbs* device" in prefill_ready.message
    assert cond(after, "DecodeReady").status == "True"
    assert after.roles[0].message == REFUSAL, "the termination message, not the back-off note"
    assert after.phase == "Degraded" and "uverbs" in after.message
    refusals = [e for e in observe.events(before, after) if e.reason == "PreflightFailed"]
    assert len(refusals) == 1 and refusals[0].type == "Warning" and "uverbs" in refusals[0].message
    again = observed(SIM, statuses, previous=after)
    assert not [e for e in observe.events(after, again) if e.reason == "PreflightFailed"], "once per refusal"


def test_other_crashes_are_not_called_preflight_failures() -> None:
    statuses = [crash_looping("prefill", 1, "Traceback ..."), container_status("decode"), container_status("proxy")]
    out = observed(SIM, statuses)
    assert cond(out, "PrefillReady").reason == "ContainersNotReady"
    assert out.roles[0].message == "Traceback ..."
    assert not [e for e in observe.events(PDDeploymentStatus(), out) if e.reason == "PreflightFailed"]


def test_colocated_engine_refusal_names_the_engine() -> None:
    statuses = [container_status("engine-0"), crash_looping("engine-1", 78, REFUSAL), container_status("proxy")]
    engine_ready = cond(observed(COLOCATED, statuses), "EngineReady")
    assert engine_ready.reason == "PreflightFailed" and engine_ready.message.startswith("engine-1: ")
