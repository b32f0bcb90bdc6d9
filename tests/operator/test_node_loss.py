"""Node loss: the serving pod's node is NotReady or unreachable; past the grace the pod is force-deleted
and recreated elsewhere, and a NodeLost condition and Events say so. Pure: decide() over typed views."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from typing import Any

from pd_operator import decide, layout, render
from pd_operator.actions import Create, Decision, Delete
from pd_operator.refusals import ApiFailure
from pd_operator.validation import validate_spec
from pd_operator.views import NOT_READY_TAINT, UNREACHABLE_TAINT, node_loss_tolerations, node_view
from tests.operator.podfacts import running_pod
from tests.operator.test_decide import OWNER, SPEC, T0, serving, snapshot, stored

# What DefaultTolerationSeconds admission adds to every pod that sets none of its own.
ADMISSION_DEFAULTS = [
    {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]


def node(name: str = "mi300x-0", ready: str = "True", since: datetime = T0) -> dict[str, Any]:
    """A Node as the node lifecycle controller leaves it: Ready's status and when it last changed."""
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": ready, "lastTransitionTime": stamp}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def pod_on(tolerations: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    pod = serving(**kw)
    pod["spec"]["tolerations"] = ADMISSION_DEFAULTS if tolerations is None else tolerations
    return pod


def tick(after_s: float, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kw: Any) -> Decision:
    views = {n["metadata"]["name"]: node_view(n) for n in nodes}
    return decide.decide(snapshot(pods=pods, nodes=views, now=T0 + timedelta(seconds=after_s), **kw))


def node_lost(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == "NodeLost"), None)


def deletes(decision: Decision) -> list[Delete]:
    """The deletes, each checked to carry its pod's uid as precondition (and compared without it)."""
    found = [a for a in decision.actions if isinstance(a, Delete)]
    assert all(a.uid and a.uid.startswith("pod-uid-") for a in found), found
    return [dataclasses.replace(a, uid=None) for a in found]


def test_a_ready_node_adds_no_condition_and_keeps_the_pod() -> None:
    decision = tick(3600, [node()], [pod_on()])
    assert decision.status.phase == "Ready" and deletes(decision) == []
    assert node_lost(stored({}, decision)) is None


def test_within_the_grace_the_pod_stays_and_the_deployment_is_degraded() -> None:
    decision = tick(120, [node(ready="Unknown")], [pod_on()])
    assert deletes(decision) == []
    assert decision.status.phase == "Degraded"
    found = node_lost(stored({}, decision))
    assert found is not None and (found["status"], found["reason"]) == ("False", "NodeNotReady")
    assert "node mi300x-0 is unreachable since 2026-11-29T08:00:00Z" in found["message"]
    assert "replaced 300s after that" in found["message"]
    assert [e.reason for e in decision.events if e.reason.startswith("Node")] == ["NodeNotReady"]


def test_past_the_grace_the_pod_is_force_deleted_with_an_event_and_condition() -> None:
    decision = tick(300, [node(ready="Unknown")], [pod_on()])
    assert deletes(decision) == [Delete("Pod", "demo", grace_seconds=0)]
    assert decision.status.phase == "Progressing"
    found = node_lost(stored({}, decision))
    assert found is not None and (found["status"], found["reason"]) == ("True", "NodeLost")
    assert "past the 300s grace: the serving pod demo is force-deleted" in found["message"]
    lost = [e for e in decision.events if e.reason == "NodeLost"]
    assert len(lost) == 1 and lost[0].type == "Warning" and lost[0].message == found["message"]


def test_a_not_ready_node_counts_like_an_unreachable_one() -> None:
    decision = tick(300, [node(ready="False")], [pod_on()])
    assert deletes(decision) == [Delete("Pod", "demo", grace_seconds=0)]
    found = node_lost(stored({}, decision))
    assert found is not None and "is NotReady since" in found["message"]


def test_the_operator_grace_is_configurable() -> None:
    assert deletes(tick(19, [node(ready="Unknown")], [pod_on()], node_lost_grace_s=20)) == []
    assert deletes(tick(20, [node(ready="Unknown")], [pod_on()], node_lost_grace_s=20)) != []


def test_a_shorter_toleration_of_the_pod_wins_and_forever_keeps_it() -> None:
    short = [{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]
    assert deletes(tick(5, [node(ready="Unknown")], [pod_on(short)])) != []
    assert deletes(tick(5, [node(ready="False")], [pod_on(short)])) == [], "not-ready keeps the operator's 300s"
    forever = [{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute"}]
    decision = tick(86400, [node(ready="Unknown")], [pod_on(forever)])
    assert deletes(decision) == []
    found = node_lost(stored({}, decision))
    assert found is not None and "tolerates node.kubernetes.io/unreachable forever" in found["message"]


def test_a_pod_left_terminating_on_a_lost_node_is_force_deleted() -> None:
    """The taint eviction controller's graceful delete never completes without a kubelet."""
    evicted = pod_on()
    evicted["metadata"]["deletionTimestamp"] = "2026-11-29T08:05:00Z"
    decision = tick(400, [node(ready="Unknown")], [evicted])
    assert deletes(decision) == [Delete("Pod", "demo", grace_seconds=0)]


def test_a_failed_force_delete_is_the_status_message() -> None:
    forbidden = ApiFailure(403, "Forbidden", 'pods "demo" is forbidden: no delete')
    decision = tick(300, [node(ready="Unknown")], [pod_on()], failed={"delete Pod/demo": forbidden})
    assert decision.status.message == (
        'cannot force-delete the serving pod on lost node mi300x-0: Pod/demo refused by admission: pods "demo" '
        "is forbidden: no delete"
    )
    assert deletes(decision) == []


def test_node_lost_stays_true_until_the_replacement_is_ready_then_recovered() -> None:
    lost = stored({}, tick(300, [node(ready="Unknown")], [pod_on()]))
    created = tick(305, [node(ready="Unknown")], [], status=lost)
    assert [type(a) for a in created.actions if isinstance(a, Create)] == [Create]
    pending = stored(lost, created)
    assert node_lost(pending) == node_lost(lost)
    starting = pod_on(ready=False, uid="pod-uid-2")
    starting["spec"]["nodeName"] = "mi300x-1"
    nodes = [node(ready="Unknown"), node("mi300x-1")]
    waiting = tick(310, nodes, [starting], status=pending)
    starting_status = stored(pending, waiting)
    assert node_lost(starting_status) == node_lost(lost)
    assert not [e for e in waiting.events if e.reason == "NodeLost"], "one Event per loss"
    replaced = pod_on(uid="pod-uid-2")
    replaced["spec"]["nodeName"] = "mi300x-1"
    recovered = stored(starting_status, tick(320, nodes, [replaced], status=starting_status))
    found = node_lost(recovered)
    assert found is not None and (found["status"], found["reason"]) == ("False", "Recovered")
    assert found["message"] == "the serving pod demo is Ready on node mi300x-1"
    assert "conditions" not in tick(330, nodes, [replaced], status=recovered).patch, "steady after recovery"


def test_a_node_back_within_the_grace_says_so() -> None:
    troubled = stored({}, tick(60, [node(ready="Unknown")], [pod_on()]))
    back = tick(90, [node(since=T0 + timedelta(seconds=80))], [pod_on()], status=troubled)
    found = node_lost(stored(troubled, back))
    assert found is not None and (found["status"], found["reason"]) == ("False", "NodeReady")
    assert back.status.phase == "Ready"


def test_steady_trouble_writes_nothing() -> None:
    first = stored({}, tick(60, [node(ready="Unknown")], [pod_on()]))
    assert tick(90, [node(ready="Unknown")], [pod_on()], status=first).patch == {}


def test_tolerations_read_as_the_taint_eviction_controller_reads_them() -> None:
    assert node_loss_tolerations(ADMISSION_DEFAULTS) == {NOT_READY_TAINT: 300.0, UNREACHABLE_TAINT: 300.0}
    everything: list[dict[str, Any]] = [{"operator": "Exists"}]
    assert node_loss_tolerations(everything) == {NOT_READY_TAINT: math.inf, UNREACHABLE_TAINT: math.inf}
    mixed: list[dict[str, Any]] = [
        {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        {"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": 10},
        {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
        {"key": NOT_READY_TAINT, "operator": "Equal", "value": "x", "effect": "NoExecute"},
        {"key": "other", "operator": "Exists", "effect": "NoExecute"},
    ]
    assert node_loss_tolerations(mixed) == {UNREACHABLE_TAINT: 10.0}
    negative: list[dict[str, Any]] = [{"key": UNREACHABLE_TAINT, "operator": "Exists", "tolerationSeconds": -5}]
    assert node_loss_tolerations(negative) == {UNREACHABLE_TAINT: 0.0}


def test_a_node_without_a_ready_condition_yet_is_no_trouble() -> None:
    fresh = {"metadata": {"name": "mi300x-0"}, "status": {}}
    assert node_view(fresh).loss_taint is None
    decision = decide.decide(snapshot(pods=[pod_on()], nodes={"mi300x-0": node_view(fresh)}))
    assert deletes(decision) == [] and node_lost(stored({}, decision)) is None


def replica_on(index: int, node_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    pod = running_pod(render.pod(layout.build(OWNER, validate_spec(spec)), index), uid=f"pod-uid-r{index}")
    pod["spec"]["nodeName"], pod["spec"]["tolerations"] = node_name, ADMISSION_DEFAULTS
    return pod


def test_with_replicas_only_the_lost_nodes_pods_are_force_deleted() -> None:
    spec = {**SPEC, "replicas": 2}
    pods = [replica_on(0, "mi300x-0", spec), replica_on(1, "mi300x-1", spec)]
    decision = tick(300, [node(), node("mi300x-1", ready="Unknown")], pods, spec=spec)
    assert deletes(decision) == [Delete("Pod", "demo-1", grace_seconds=0)]
    found = node_lost(stored({}, decision))
    assert found is not None and found["status"] == "True" and "demo-1" in found["message"]


def test_a_surplus_pod_on_a_lost_node_is_force_deleted_too() -> None:
    """Scaling down deletes pods gracefully; on a lost node that would never finish."""
    two = {**SPEC, "replicas": 2}
    pods = [replica_on(0, "mi300x-0", two), replica_on(1, "mi300x-1", two)]
    decision = tick(300, [node(), node("mi300x-1", ready="Unknown")], pods)
    assert deletes(decision) == [Delete("Pod", "demo-1", grace_seconds=0)]
    assert [e.reason for e in decision.events if e.reason in ("NodeLost", "ScalingDown")] == ["NodeLost"]
