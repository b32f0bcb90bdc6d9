"""decide.py: one snapshot in, the status and the actions out; no I/O anywhere."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pd_operator import autotune, decide, layout, render
from pd_operator.actions import Apply, Create, CreateSecret, Decision, Delete, Emit
from pd_operator.api import RUN_PROBE_ANNOTATION
from pd_operator.observe import ProxyReport, wire
from pd_operator.refusals import ApiFailure
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import validate_spec
from pd_operator.views import job_view, pod_view
from tests.operator.podfacts import ENGINE_RELEASE, finished_job, proxy_status, running_pod, summary

NS, NAME, UID = "ns1", "demo", "uid-1"
SPEC: dict[str, Any] = {"model": "m", "engine": "simulated", "goodputProbe": {"enabled": True}}
T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
OWNER = layout.Owner(NAME, NS, UID, 1)


def snapshot(spec: dict[str, Any] = SPEC, status: dict[str, Any] | None = None, **kw: Any) -> Snapshot:
    pods = [pod_view(p) for p in kw.pop("pods", [])]
    jobs = [job_view(j) for j in kw.pop("jobs", [])]
    annotations = kw.pop("annotations", {})
    deployment = Deployment(NAME, NS, UID, 1, spec, status or {}, annotations)
    return planned(Snapshot(deployment, kw.pop("now", T0), pods=pods, jobs=jobs, **kw))


def planned(snap: Snapshot) -> Snapshot:
    """The snapshot with autotune's plan where the core needs one, as the shell adds it (off its event loop)."""
    spec = decide.plan_for(snap)
    return snap if spec is None else dataclasses.replace(snap, plan=autotune.plan(spec))


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def stored(previous: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The status after the API server applied the decision's patch: exactly the decided status."""
    after: dict[str, Any] = merged(previous, decision.patch)
    assert after == wire(decision.status)
    return after


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def serving(spec: dict[str, Any] = SPEC, **kw: Any) -> dict[str, Any]:
    return running_pod(render.pod(layout.build(OWNER, validate_spec(spec))), **kw)


def one_proxy(**report: Any) -> dict[str, ProxyReport]:
    """The report of the one replica's proxy, as the handlers pass it."""
    return {NAME: ProxyReport(**report)}


def kinds(decision: Decision, action: type) -> list[str]:
    found = [a for a in decision.actions if isinstance(a, action)]
    return [a.kind if isinstance(a, Delete) else a.obj["kind"] for a in found]  # type: ignore[attr-defined]


def test_first_pass_applies_children_creates_the_pod_and_reports_pending() -> None:
    decision = decide.decide(snapshot())
    assert kinds(decision, Apply) == ["Service", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"]
    assert kinds(decision, Create) == ["Pod"]
    assert decision.patch["phase"] == "Pending"
    assert [e.reason for e in decision.events][:2] == ["CreatedPod", "Pending"]


def test_children_are_applied_only_when_asked() -> None:
    assert kinds(decide.decide(snapshot(repair_children=False)), Apply) == []


def test_the_credentials_secret_is_created_before_anything_else_and_never_applied() -> None:
    first = decide.decide(snapshot()).actions[0]
    assert isinstance(first, CreateSecret) and first.keys == ("engine-key", "admin-key")
    assert "stringData" not in first.obj and "data" not in first.obj, "the shell draws the values"
    assert kinds(decide.decide(snapshot(repair_children=False)), CreateSecret) == []


def test_invalid_spec_is_failed_with_no_actions_but_events() -> None:
    decision = decide.decide(snapshot({"model": "m", "prefill": {"gpus": "9-0"}}))
    assert decision.status.phase == "Failed"
    assert cond(decision.patch, "SpecValid")["status"] == "False"
    assert [e.reason for e in decision.events] == ["Failed", "InvalidSpec"]
    assert all(isinstance(a, Emit) for a in decision.actions)


def test_a_failed_pod_creation_becomes_the_status_message() -> None:
    first = decide.decide(snapshot())
    key = next(a.key for a in first.actions if isinstance(a, Create))
    again = decide.decide(snapshot(failed={key: ApiFailure(0, message="connection refused")}))
    assert again.status.phase == "Pending" and "cannot create the serving pod" in again.status.message
    assert "CreatedPod" not in {e.reason for e in again.events}


POD_SECURITY_REFUSAL = ApiFailure(
    403,
    "Forbidden",
    'pods "demo" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
    'non-default capabilities (containers "prefill", "decode" must not include "IPC_LOCK", "SYS_PTRACE" in '
    "securityContext.capabilities.add)",
)


def test_a_refused_pod_is_a_condition_and_one_event_naming_policy_and_fields() -> None:
    first = decide.decide(snapshot())
    key = next(a.key for a in first.actions if isinstance(a, Create))
    refused = decide.decide(snapshot(failed={key: POD_SECURITY_REFUSAL}))
    admitted = cond(refused.patch, "ChildrenAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "PodSecurity")
    assert admitted["message"].startswith('Pod/demo refused by PodSecurity "baseline:latest": host namespaces')
    assert "securityContext.capabilities.add" in admitted["message"]
    [event] = [e for e in refused.events if e.reason == "ChildRefused"]
    assert event.type == "Warning" and event.message == admitted["message"]
    assert "refused by PodSecurity" in refused.status.message
    # the same refusal on the next tick is no news; the children are written again on every tick meanwhile
    stored_status = stored({}, refused)
    assert decide.children_refused(stored_status)
    again = decide.decide(snapshot(status=stored_status, failed={key: POD_SECURITY_REFUSAL}))
    assert "ChildRefused" not in {e.reason for e in again.events}
    fixed = decide.decide(snapshot(status=stored_status))
    assert cond(fixed.patch, "ChildrenAdmitted")["status"] == "True"
    assert not decide.children_refused(stored(stored_status, fixed))


def test_a_refused_network_policy_shows_although_the_pod_was_created() -> None:
    invalid = ApiFailure(
        422,
        "Invalid",
        'NetworkPolicy.networking.k8s.io "demo" is invalid: spec.ingress[0].ports[0].port: Invalid value',
        (("spec.ingress[0].ports[0].port", "Invalid value: 0: must be between 1 and 65535"),),
    )
    decision = decide.decide(snapshot(failed={"apply NetworkPolicy/demo": invalid}))
    admitted = cond(decision.patch, "ChildrenAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "Invalid")
    assert admitted["message"] == (
        "NetworkPolicy/demo refused by API validation: spec.ingress[0].ports[0].port: Invalid value: 0: must be "
        "between 1 and 65535"
    )
    # a tick that writes no children keeps what the last write found
    kept = decide.decide(snapshot(status=stored({}, decision), repair_children=False))
    assert cond(wire(kept.status), "ChildrenAdmitted") == admitted


def test_without_the_canary_the_proxy_is_read_until_the_transfer_is_verified_for_this_pod() -> None:
    spec = {"model": "m", "engine": "simulated", "proxy": {"canaryIntervalSeconds": 0}}
    pod = serving(spec)
    assert decide.proxy_urls(snapshot(spec, pods=[pod])) == {NAME: "http://10.1.2.3:8001/status"}
    ready = decide.decide(snapshot(spec, pods=[pod], proxies=one_proxy(status=proxy_status())))
    assert cond(ready.patch, "KVTransferVerified")["status"] == "True"
    assert not decide.proxy_urls(snapshot(spec, status=stored({}, ready), pods=[pod]))


def test_the_status_shows_the_release_each_engine_runs_and_keeps_it_while_the_proxy_is_not_read() -> None:
    spec = {"model": "m", "engine": "simulated", "proxy": {"canaryIntervalSeconds": 0}}
    pod = serving(spec)
    ready = decide.decide(snapshot(spec, pods=[pod], proxies=one_proxy(status=proxy_status())))
    both, status = {"prefill": ENGINE_RELEASE, "decode": ENGINE_RELEASE}, stored({}, ready)
    assert status["replicaStatuses"][0]["engineVersions"] == both
    assert {r["name"]: r.get("engineVersion") for r in status["roles"]} == both | {"proxy": None}
    assert status["engineVersion"] == ENGINE_RELEASE
    later = decide.decide(snapshot(spec, status=stored({}, ready), pods=[pod]))
    assert stored(stored({}, ready), later)["engineVersion"] == ENGINE_RELEASE


def test_with_the_canary_a_verified_kv_path_that_breaks_later_turns_false_with_an_event() -> None:
    pod = serving()
    ready = decide.decide(snapshot(pods=[pod], proxies=one_proxy(status=proxy_status())))
    verified = stored({}, ready)
    assert decide.proxy_urls(snapshot(status=verified, pods=[pod])) == {NAME: "http://10.1.2.3:8001/status"}
    broken = decide.decide(snapshot(status=verified, pods=[pod], proxies=one_proxy(status=proxy_status(mismatch=True))))
    kv = cond(broken.patch, "KVTransferVerified")
    assert (kv["status"], kv["reason"]) == ("False", "KVMismatch") and "at token 3" in kv["message"]
    assert [(e.type, e.reason) for e in broken.events if e.reason == "KVMismatch"] == [("Warning", "KVMismatch")]
    again = decide.decide(
        snapshot(status=stored(verified, broken), pods=[pod], proxies=one_proxy(status=proxy_status(mismatch=True)))
    )
    assert "KVMismatch" not in {e.reason for e in again.events}  # one Event per flip


def test_ready_pod_starts_a_probe() -> None:
    decision = decide.decide(snapshot(pods=[serving()], proxies=one_proxy(status=proxy_status())))
    assert decision.status.phase == "Ready"
    job = next(a.obj for a in decision.actions if isinstance(a, Create))
    assert job["kind"] == "Job" and job["spec"]["template"]["spec"]["containers"][0]["command"][:2] == [
        "pdctl",
        "bench",
    ]
    assert decision.patch["probe"]["jobName"] == job["metadata"]["name"]
    assert decision.patch["probe"]["trigger"] == "ready"
    assert "GoodputProbeStarted" in {e.reason for e in decision.events}


def finish_probe(message: str | None) -> tuple[Decision, dict[str, Any], str]:
    pod = serving()
    started = decide.decide(snapshot(pods=[pod], proxies=one_proxy(status=proxy_status())))
    job = next(a.obj for a in started.actions if isinstance(a, Create) and a.obj["kind"] == "Job")
    done, job_pod = finished_job(job, message)
    status = stored({}, started)
    later = decide.decide(snapshot(status=status, pods=[pod, job_pod], jobs=[done], now=T0 + timedelta(seconds=30)))
    return later, stored(status, later), job["metadata"]["name"]


def test_finished_probe_fills_status_goodput_and_is_cleaned_up() -> None:
    decision, status, job_name = finish_probe(json.dumps(summary(0.95)))
    assert status["goodput"]["attainment"] == 0.95 and status["goodput"]["summary"] == "95% @8/s"
    assert cond(status, "GoodputMet")["status"] == "True"
    assert "jobName" not in status["probe"] and status["probe"]["lastFinishedAt"] == "2026-11-29T08:00:30Z"
    assert decision.patch["probe"]["jobName"] is None, "the merge patch deletes the finished Job's name"
    deletes = [(a.kind, a.name) for a in decision.actions if isinstance(a, Delete)]
    assert deletes == [("Job", job_name), ("Pod", f"{job_name}-abcde")]
    assert {"GoodputMeasured", "GoodputMet"} <= {e.reason for e in decision.events}


def test_missed_target() -> None:
    _, status, _ = finish_probe(json.dumps(summary(0.29)))
    assert cond(status, "GoodputMet")["status"] == "False"


def test_probe_without_summary_records_the_error() -> None:
    decision, status, _ = finish_probe(None)
    assert "without a summary" in status["probe"]["lastError"] and "goodput" not in status
    assert "GoodputProbeFailed" in {e.reason for e in decision.events}


def test_annotation_runs_a_probe_on_demand() -> None:
    _, status, _ = finish_probe(json.dumps(summary()))
    pod = serving()
    quiet = decide.decide(snapshot(status=status, pods=[pod], repair_children=False))
    assert quiet.patch == {} and quiet.actions == ()
    asked = decide.decide(snapshot(status=status, pods=[pod], annotations={RUN_PROBE_ANNOTATION: "now"}))
    assert asked.patch["probe"]["trigger"] == "annotation" and asked.patch["probe"]["lastAnnotation"] == "now"


def test_spec_change_rolls_the_pod() -> None:
    decision = decide.decide(snapshot({**SPEC, "image": "ghcr.io/pd-serving/pd-runtime:0.2.0"}, pods=[serving()]))
    assert [(a.kind, a.name) for a in decision.actions if isinstance(a, Delete)] == [("Pod", NAME)]
    assert "RollingPod" in {e.reason for e in decision.events}
    assert decision.status.phase == "Progressing" and "observedGeneration" not in decision.patch


def test_ended_pod_is_replaced_and_terminating_pod_awaited() -> None:
    ended = serving()
    ended["status"]["phase"] = "Failed"
    assert "ReplacingPod" in {e.reason for e in decide.decide(snapshot(pods=[ended])).events}
    ended["metadata"]["deletionTimestamp"] = "2026-11-29T08:00:00Z"
    waiting = decide.decide(snapshot(pods=[ended], repair_children=False))
    assert not any(isinstance(a, (Create, Delete)) for a in waiting.actions)


def test_steady_state_writes_nothing_and_does_nothing() -> None:
    spec = {"model": "m", "engine": "simulated"}
    pod = serving(spec)
    first = decide.decide(snapshot(spec, pods=[pod], proxies=one_proxy(status=proxy_status())))
    later = snapshot(spec, status=stored({}, first), pods=[pod], repair_children=False, now=T0 + timedelta(hours=1))
    second = decide.decide(dataclasses.replace(later, proxies=one_proxy(status=proxy_status())))
    assert second.patch == {} and second.actions == ()


def test_a_new_pod_uid_reaches_the_status() -> None:
    spec = {"model": "m", "engine": "simulated"}
    first = decide.decide(snapshot(spec, pods=[serving(spec)], proxies=one_proxy(status=proxy_status())))
    moved = snapshot(spec, status=stored({}, first), pods=[serving(spec, uid="pod-uid-2")], repair_children=False)
    second = decide.decide(dataclasses.replace(moved, proxies=one_proxy(error="timeout")))
    assert second.patch["podUid"] == "pod-uid-2"
    assert cond(second.patch, "KVTransferVerified")["reason"] == "ProxyUnreachable"


def test_probe_jobs_run_the_operator_image_the_shell_names() -> None:
    image = "ghcr.io/pd-serving/pd-operator:0.1.0"
    snap = snapshot(pods=[serving()], proxies=one_proxy(status=proxy_status()), probe_image=image)
    job = next(a.obj for a in decide.decide(snap).actions if isinstance(a, Create))
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_the_network_policy_admits_the_operator_from_the_namespace_the_shell_names() -> None:
    applied = decide.decide(snapshot(operator_namespace="ops")).actions
    policy = next(a.obj for a in applied if isinstance(a, Apply) and a.obj["kind"] == "NetworkPolicy")
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]
    [operator] = [p for p in peers if p["podSelector"]["matchLabels"] == render.OPERATOR_POD_LABELS]
    assert operator["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
