"""observe.py: phase, conditions, per-role status and events from typed views of what the operator sees."""

from __future__ import annotations

from typing import Any

from pd_operator import layout, observe, render
from pd_operator.api import PDDeploymentSpec
from pd_operator.observe import Observation, ProxyReport, ReplicaObservation
from pd_operator.validation import validate_spec
from pd_operator.views import pod_view
from tests.operator.podfacts import container_status, proxy_status, running_pod

OWNER = layout.Owner(name="demo", namespace="ns1", uid="uid-1", generation=2)
SIM = validate_spec({"model": "m", "engine": "simulated"})
COLOCATED = validate_spec({"model": "m", "engine": "simulated", "mode": "colocated"})
NOW = "2026-11-29T08:00:00Z"


def lay(spec: PDDeploymentSpec) -> layout.Layout:
    return layout.build(OWNER, spec)


def rendered(spec: PDDeploymentSpec) -> dict[str, Any]:
    return render.pod(lay(spec))


def obs(
    spec: Any = SIM,
    pod: Any = None,
    previous: Any = None,
    now: str = NOW,
    pod_current: bool = True,
    proxy: ProxyReport | None = None,
) -> Observation:
    """An observation of one replica's pod document (as the API server returns it) and a stored status."""
    prior = observe.parse(previous or {})
    view = pod_view(pod) if pod is not None else None
    replica = ReplicaObservation(0, view, pod_current, proxy=proxy)
    return Observation(generation=2, now=now, spec=spec, layout=lay(spec), replicas=(replica,), previous=prior)


def status(o: Observation) -> dict[str, Any]:
    """The status as the operator stores it."""
    return observe.wire(observe.status(o))


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_invalid_spec_is_failed_with_spec_valid_false() -> None:
    out = status(Observation(generation=1, now=NOW, spec=None, spec_problems=["spec.model: Required value"]))
    assert out["phase"] == "Failed" and "spec.model: Required value" in out["message"]
    assert cond(out, "SpecValid")["status"] == "False"


def test_no_pod_is_pending() -> None:
    out = status(obs())
    assert out["phase"] == "Pending" and out["ready"] == "0/1" and out["containersReady"] == "0/3"
    assert cond(out, "PrefillReady")["reason"] == "NoPod"
    assert "observedGeneration" not in out


def test_all_ready_is_ready_with_per_role_details() -> None:
    pod = running_pod(rendered(SIM))
    out = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status())))
    assert out["phase"] == "Ready" and out["observedGeneration"] == 2
    assert (out["ready"], out["containersReady"], out["replicas"], out["readyReplicas"]) == ("1/1", "3/3", 1, 1)
    assert (out["podName"], out["podIP"], out["nodeName"], out["podUid"]) == (
        "demo",
        "10.1.2.3",
        "mi300x-0",
        "pod-uid-1",
    )
    assert [r["role"] for r in out["roles"]] == ["prefill", "decode", "proxy"]
    for kind in ("SpecValid", "PrefillReady", "DecodeReady", "ProxyReady", "Ready", "KVTransferVerified"):
        assert cond(out, kind)["status"] == "True", kind
    assert cond(out, "GoodputMet")["reason"] == "ProbeDisabled"


def test_unscheduled_pod_is_pending_with_the_scheduler_message() -> None:
    pod = running_pod(rendered(SIM), ready=False)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "message": "0/1 nodes: Insufficient amd.com/gpu"}
    ]
    out = status(obs(pod=pod))
    assert out["phase"] == "Pending" and "Insufficient amd.com/gpu" in out["message"]


def test_crash_is_degraded_with_the_termination_message() -> None:
    pod = rendered(SIM)
    statuses = [
        container_status("prefill", False, 3, "CrashLoopBackOff", "preflight: /dev/shm is 64 MiB"),
        container_status("decode"),
        container_status("proxy", False),
    ]
    out = status(obs(pod=running_pod(pod, statuses=statuses)))
    assert out["phase"] == "Degraded" and "preflight: /dev/shm is 64 MiB" in out["message"]
    prefill = out["roles"][0]
    assert (prefill["restartCount"], prefill["state"], prefill["reason"]) == (3, "waiting", "CrashLoopBackOff")


def test_starting_containers_are_progressing() -> None:
    out = status(obs(pod=running_pod(rendered(SIM), ready=False)))
    assert out["phase"] == "Progressing" and out["message"] == "waiting for prefill, decode, proxy"


def test_rolling_and_terminating_pods_are_progressing() -> None:
    pod = running_pod(rendered(SIM))
    assert status(obs(pod=pod, pod_current=False))["phase"] == "Progressing"
    pod["metadata"]["deletionTimestamp"] = NOW
    assert status(obs(pod=pod))["message"] == "the serving pod is terminating"


def test_kv_transfer_verified_needs_both_legs_and_sticks_for_the_pod() -> None:
    pod = running_pod(rendered(SIM))
    waiting = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status(transfer=False))))
    assert cond(waiting, "KVTransferVerified")["reason"] == "NoTransferYet"
    verified = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status())))
    assert "tx-1" in cond(verified, "KVTransferVerified")["message"]
    later = status(obs(pod=pod, proxy=ProxyReport(error="timeout"), previous=verified))
    assert cond(later, "KVTransferVerified")["status"] == "True"
    new_pod = running_pod(rendered(SIM), uid="pod-uid-2")
    fresh = status(obs(pod=new_pod, proxy=ProxyReport(error="timeout"), previous=verified))
    assert cond(fresh, "KVTransferVerified")["reason"] == "ProxyUnreachable"


def test_a_kv_mismatch_turns_kv_transfer_verified_false_and_an_unreadable_proxy_keeps_it() -> None:
    pod = running_pod(rendered(SIM))
    verified = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status())))
    broken = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status(mismatch=True)), previous=verified))
    kv = cond(broken, "KVTransferVerified")
    assert (kv["status"], kv["reason"]) == ("False", "KVMismatch")
    assert kv["message"].startswith("the proxy's canary at 2026-11-29T08:05:00.000Z: decode's tokens")
    assert broken["replicaStatuses"][0]["available"] is False  # not serving for rollouts
    assert broken["phase"] == "Ready"  # the pod serves (report); KVTransferVerified says what is wrong
    events = observe.events(observe.parse(verified), observe.parse(broken))
    assert [(e.type, e.reason) for e in events] == [("Warning", "KVMismatch")]
    unreadable = status(obs(pod=pod, proxy=ProxyReport(error="timeout"), previous=broken))
    assert cond(unreadable, "KVTransferVerified")["reason"] == "KVMismatch"
    # a proxy that reports no mismatch (it restarted) is back to the transfers it saw
    restarted = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status()), previous=broken))
    assert cond(restarted, "KVTransferVerified")["status"] == "True"


def test_an_unreachable_proxy_writes_no_new_status_when_only_the_error_text_changes() -> None:
    """Under load one poll times out and the next is refused: the same news, so no status patch."""
    pod = running_pod(rendered(SIM))
    refused = status(obs(pod=pod, proxy=ProxyReport(error="ConnectError: All connection attempts failed")))
    timed_out = status(obs(pod=pod, proxy=ProxyReport(error="ConnectTimeout: "), previous=refused))
    assert timed_out == refused
    assert "All connection attempts failed" in cond(timed_out, "KVTransferVerified")["message"]


def test_colocated_reports_engine_ready_and_no_kv_transfer() -> None:
    out = status(obs(spec=COLOCATED, pod=running_pod(rendered(COLOCATED))))
    kinds = [c["type"] for c in out["conditions"]]
    assert "EngineReady" in kinds and "PrefillReady" not in kinds
    kv = cond(out, "KVTransferVerified")
    assert (kv["status"], kv["reason"]) == ("Unknown", "NotApplicable")
    assert out["transfer"] == "none" and out["gpuAssignment"]["engines"] == ["-", "-"]


def test_gpu_assignment_by_strategy() -> None:
    plugin = validate_spec({"model": "m", "kvTransfer": {"rdma": {"resourceName": "rdma/hca_shared_devices_a"}}})
    assert observe.gpu_assignment(lay(plugin)).prefill == "4 (plugin-chosen)"
    pinned = validate_spec(
        {"model": "m", "kvTransfer": {"rdma": {"hostNetwork": True}}, "gpuAllocation": {"strategy": "hostDevices"}}
    )
    assignment = observe.gpu_assignment(lay(pinned))
    assert (assignment.prefill, assignment.decode) == ("0-3", "4-7")
    roles = [r.model_dump(by_alias=True, exclude_none=True) for r in observe.role_statuses(lay(pinned), None)]
    assert roles[1]["gpus"] == {"count": 4, "devices": "4-7"} and "gpus" not in roles[2]


def test_transition_time_kept_while_status_unchanged() -> None:
    first = status(obs())
    later = status(obs(now="2026-11-29T09:00:00Z", previous=first))
    assert cond(later, "Ready")["lastTransitionTime"] == NOW


def test_events_for_phase_changes_and_verified_transfer() -> None:
    pod = running_pod(rendered(SIM))
    before = status(obs())
    after = status(obs(pod=pod, proxy=ProxyReport(status=proxy_status()), previous=before))
    reasons = [e.reason for e in observe.events(observe.parse(before), observe.parse(after))]
    assert reasons == ["Ready", "KVTransferVerified"]
    assert observe.events(observe.parse(after), observe.parse(after)) == []
