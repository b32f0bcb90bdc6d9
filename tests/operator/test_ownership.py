"""Own what you touch: a child of a rendered name that another owner holds is never applied (taken over),
the status and an Event say so, and serving goes on where it can; pods, Jobs and claim templates are acted on
only when their controller reference is this PDDeployment's uid, and an orphan only once adopted. Pure
decisions over what the shell read."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

from pd_operator import api, decide, render
from pd_operator.actions import Adopt, Apply, Create, CreateSecret, Decision, Delete
from pd_operator.refusals import ApiFailure, refusal
from pd_operator.snapshot import Snapshot
from pd_operator.views import ObjectView, OwnerRef
from tests.operator.podfacts import finished_job, proxy_status, summary
from tests.operator.test_decide import NAME, OWNER, SPEC, T0, UID, cond, one_proxy, serving, snapshot, stored

FOREIGN = (OwnerRef("Deployment", "team-a", "uid-team-a"),)
OURS = (OwnerRef("PDDeployment", NAME, UID),)
ROUTED: dict[str, Any] = {**SPEC, "router": {"enabled": True}}


THIS = ObjectView(api.KIND, NAME, UID)  # the PDDeployment as read again before adopting


def confirmed(snap: Snapshot) -> Snapshot:
    """The snapshot with the PDDeployment read again, as the shell adds it when ``owner_read`` asks."""
    return dataclasses.replace(snap, reread=THIS) if decide.owner_read(snap) else snap


def seeing(spec: dict[str, Any] = SPEC, **views: ObjectView | None) -> Snapshot:
    """A repair whose reads found ``views`` (by Kind/name; every other child absent)."""
    snap = snapshot(spec)
    absent: dict[str, ObjectView | None] = {f"{k}/{n}": None for k, n in decide.applied_children(snap)}
    return dataclasses.replace(snap, seen={**absent, **views})


def view(key: str, owners: tuple[OwnerRef, ...] = FOREIGN, labels: dict[str, str] | None = None) -> ObjectView:
    kind, _, name = key.partition("/")
    return ObjectView(kind, name, f"uid-of-{name}", owners, labels or {})


def applied(decision: Decision) -> dict[str, dict[str, Any]]:
    return {f"{a.obj['kind']}/{a.obj['metadata']['name']}": a.obj for a in decision.actions if isinstance(a, Apply)}


def creates_the_pod(decision: Decision) -> bool:
    return any(isinstance(a, Create) and a.obj["kind"] == "Pod" for a in decision.actions)


def test_a_service_of_another_owner_is_left_alone_and_said_so_while_the_pod_serves() -> None:
    key = f"Service/{NAME}"
    decision = decide.decide(seeing(**{key: view(key)}))
    assert key not in applied(decision) and f"ConfigMap/{NAME}-proxy" in applied(decision)
    assert creates_the_pod(decision)
    found = cond(stored({}, decision), "ChildrenAdmitted")
    assert (found["status"], found["reason"]) == ("False", "NameConflict")
    assert (
        f"Service/{NAME} (uid uid-of-{NAME}) exists and belongs to Deployment/team-a (uid uid-team-a)"
        in (found["message"])
    )
    assert "serving goes on without its Service" in found["message"]
    (event,) = [e for e in decision.events if e.reason == "NameConflict"]
    assert event.type == "Warning" and f"Service/{NAME}" in event.message and "Deployment/team-a" in event.message


def test_an_object_without_owner_or_labels_is_another_owners_too() -> None:
    key = f"Service/{NAME}"
    decision = decide.decide(seeing(**{key: view(key, owners=())}))
    assert key not in applied(decision)
    assert "belongs to no owner reference" in cond(stored({}, decision), "ChildrenAdmitted")["message"]


def test_a_proxy_configmap_of_another_owner_keeps_the_pod_from_being_created() -> None:
    key = f"ConfigMap/{NAME}-proxy"
    decision = decide.decide(seeing(**{key: view(key)}))
    assert key not in applied(decision) and not creates_the_pod(decision)
    status = stored({}, decision)
    assert (
        "the serving pod is not created: its proxy would read the settings of that ConfigMap"
        in (cond(status, "ChildrenAdmitted")["message"])
    )
    assert "the serving pod is not created" in status["message"]


def test_a_credentials_secret_of_another_owner_is_not_used_and_keeps_the_pod_from_being_created() -> None:
    key = f"Secret/{NAME}-credentials"
    decision = decide.decide(seeing(**{key: view(key)}))
    assert not any(isinstance(a, CreateSecret) for a in decision.actions) and not creates_the_pod(decision)
    found = cond(stored({}, decision), "ChildrenAdmitted")
    assert (found["status"], found["reason"]) == ("False", "NameConflict")
    assert "take their keys from a Secret another owner chose" in found["message"]


def test_a_credentials_secret_of_its_own_is_left_as_it_is() -> None:
    key = f"Secret/{NAME}-credentials"
    decision = decide.decide(seeing(**{key: view(key, owners=OURS)}))
    assert not any(isinstance(a, CreateSecret) for a in decision.actions), "no create that would meet a 409"
    assert creates_the_pod(decision)


def test_children_of_ours_and_known_ones_are_applied_with_their_uid_as_precondition() -> None:
    service, policy = f"Service/{NAME}", f"NetworkPolicy/{NAME}"
    snap = dataclasses.replace(seeing(**{service: view(service, owners=OURS)}), known={policy: "uid-known"})
    objs = applied(decide.decide(snap))
    assert objs[service]["metadata"]["uid"] == f"uid-of-{NAME}" and objs[policy]["metadata"]["uid"] == "uid-known"
    assert "uid" not in objs[f"PodDisruptionBudget/{NAME}"]["metadata"]  # absent: created by the apply
    assert cond(stored({}, decide.decide(snap)), "ChildrenAdmitted")["status"] == "True"


def test_what_pdctl_render_made_for_this_deployment_is_adopted_once_the_owner_is_read_again() -> None:
    """No owner reference and labelled as this PDDeployment's by pd-operator: `pdctl render | kubectl apply`."""
    key = f"Service/{NAME}"
    snap = seeing(**{key: view(key, owners=(), labels=render.labels(OWNER, "serving"))})
    assert decide.owner_read(snap) and key not in applied(decide.decide(snap))  # not before the read
    assert applied(decide.decide(confirmed(snap)))[key]["metadata"]["uid"] == f"uid-of-{NAME}"
    for again in (dataclasses.replace(THIS, deleting=True), dataclasses.replace(THIS, uid="uid-of-a-new-one")):
        assert key not in applied(decide.decide(dataclasses.replace(snap, reread=again)))
    other = render.labels(dataclasses.replace(OWNER, name="other"), "serving")
    snap = seeing(**{key: view(key, owners=(), labels=other)})
    assert not decide.owner_read(snap) and key not in applied(decide.decide(confirmed(snap)))


def test_a_child_whose_read_failed_is_not_applied_and_the_condition_is_kept() -> None:
    key = f"Service/{NAME}"
    conflicted = stored({}, decide.decide(seeing(**{key: view(key)})))
    snap = dataclasses.replace(snapshot(status=conflicted), unread=frozenset({key}))
    decision = decide.decide(snap)
    assert key not in applied(decision) and f"NetworkPolicy/{NAME}" in applied(decision)
    assert cond(stored(conflicted, decision), "ChildrenAdmitted") == cond(conflicted, "ChildrenAdmitted")


def test_one_router_object_of_another_owner_leaves_the_whole_router_out() -> None:
    key = f"ServiceAccount/{NAME}-router"
    decision = decide.decide(seeing(ROUTED, **{key: view(key)}))
    router = [k for k, obj in applied(decision).items() if obj["metadata"]["name"] == f"{NAME}-router"]
    assert router == [] and f"Service/{NAME}" in applied(decision) and creates_the_pod(decision)
    assert "the router is not applied" in cond(stored({}, decision), "ChildrenAdmitted")["message"]


def test_the_shell_reads_only_children_not_known_to_be_ours() -> None:
    snap = snapshot()
    children = decide.applied_children(snap)
    known = {f"{k}/{n}": "u" for k, n in children}
    assert decide.object_reads(dataclasses.replace(snap, known=known), children) == [
        ("Deployment", f"{NAME}-router"),  # the leftover lookups, as before
        ("InferencePool", NAME),
    ]
    assert set(children) <= set(decide.object_reads(snap, children))


def test_an_apply_refused_for_its_uid_is_a_name_conflict() -> None:
    """The API server's answer to an apply whose metadata.uid is not the object's (someone replaced it)."""
    failure = ApiFailure(422, "Invalid", "...", (("metadata.uid", 'Invalid value: "u": field is immutable'),))
    found = refusal(f"Service/{NAME}", failure)
    assert found.reason == "NameConflict" and "replaced by another object" in found.describe()


def test_an_apply_whose_uid_names_no_object_says_the_child_was_deleted() -> None:
    """What the e2e API server (1.36) answers an apply naming a uid where no object of that name exists."""
    message = "uid mismatch: the provided object specified uid u, and no existing object was found"
    found = refusal(f"Service/{NAME}", ApiFailure(409, "Conflict", message))
    assert found.reason == "ChildDeleted" and "created again on the next repair" in found.describe()


# ---- pods, Jobs and claim templates: acted on only by their controller's uid -------------------------------

CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "name": "team-a", "uid": "uid-team-a", "controller": True}


def pod_of(owner: dict[str, Any] | None, name: str = NAME, spec: dict[str, Any] = SPEC) -> dict[str, Any]:
    """The serving pod this PDDeployment renders, under ``name``, with ``owner`` as its controller (None: none)."""
    pod = serving(spec, uid=f"uid-of-{name}")
    pod["metadata"]["name"] = name
    pod["metadata"]["ownerReferences"] = [owner] if owner else []
    return pod


def pod_actions(decision: Decision) -> list[str]:
    """The pod writes, as their action keys."""
    return [a.key for a in decision.actions if isinstance(a, Adopt | Create | Delete) and "Pod/" in a.key]


def test_a_labelled_pod_of_another_owner_and_name_is_not_deleted_and_said_so() -> None:
    """Once deleted as a surplus replica; now left alone, with ChildrenAdmitted False and an Event."""
    decision = decide.decide(snapshot(pods=[serving(), pod_of(CONFIGMAP, f"{NAME}-7")]))
    assert pod_actions(decision) == []
    found = cond(stored({}, decision), "ChildrenAdmitted")
    assert (found["status"], found["reason"]) == ("False", "NotOwned")
    assert (
        f"Pod/{NAME}-7 (uid uid-of-{NAME}-7) carries this PDDeployment's labels and belongs to ConfigMap/team-a "
        "(uid uid-team-a)" in found["message"]
    )
    assert "never rolled or deleted by it" in found["message"]
    (event,) = [e for e in decision.events if e.reason == "NotOwned"]
    assert event.type == "Warning" and f"Pod/{NAME}-7" in event.message
    assert decision.status.replicas == 1 and decision.status.phase == "Ready"  # not counted: serving goes on


def test_a_pod_of_another_owner_with_the_replicas_name_is_not_served_nor_created_again_and_again() -> None:
    """Not kept as the serving pod (nor rolled: its spec hash differs), no pod created under its name (a
    create would only meet 409, tick after tick), a NameConflict once, and the replica waits."""
    theirs = pod_of(CONFIGMAP, spec={**SPEC, "image": "team-a/app"})
    decision = decide.decide(snapshot(pods=[theirs]))
    assert pod_actions(decision) == [] and decide.proxy_urls(snapshot(pods=[theirs])) == {}
    status = stored({}, decision)
    found = cond(status, "ChildrenAdmitted")
    assert (found["status"], found["reason"]) == ("False", "NameConflict")
    assert f"Pod/{NAME} (uid uid-of-{NAME}) exists and belongs to ConfigMap/team-a" in found["message"]
    assert status["phase"] == "Pending" and "the serving pod is not created: Pod/demo" in status["message"]
    assert "podName" not in status and status["replicas"] == 0
    assert [e.type for e in decision.events if e.reason == "NameConflict"] == ["Warning"]
    again = decide.decide(snapshot(status=status, pods=[theirs], now=T0 + timedelta(seconds=5)))
    assert pod_actions(again) == [] and "NameConflict" not in {e.reason for e in again.events}


def test_a_pod_of_an_earlier_pddeployment_of_the_same_name_is_not_its_own() -> None:
    earlier = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": NAME, "uid": "uid-earlier", "controller": True}
    decision = decide.decide(snapshot(pods=[pod_of(earlier)]))
    assert pod_actions(decision) == []
    assert "belongs to PDDeployment/demo (uid uid-earlier)" in cond(stored({}, decision), "ChildrenAdmitted")["message"]


def test_a_job_of_another_owner_is_neither_read_as_a_probe_nor_deleted() -> None:
    """Nor the pod that carries our Job's job-name label but is not that Job's: a forged summary is never read."""
    started = decide.decide(snapshot(pods=[serving()], proxies=one_proxy(status=proxy_status())))
    job = next(a.obj for a in started.actions if isinstance(a, Create) and a.obj["kind"] == "Job")
    ours, forged = finished_job(job, json.dumps(summary(0.99)))
    forged["metadata"]["ownerReferences"] = [CONFIGMAP]
    theirs, their_pod = finished_job({**job, "metadata": {**job["metadata"], "name": "team-a-probe"}}, None)
    theirs["metadata"]["ownerReferences"] = [CONFIGMAP]
    status, later = stored({}, started), T0 + timedelta(seconds=30)
    pods = [serving(), forged, their_pod]
    decision = decide.decide(snapshot(status=status, pods=pods, jobs=[ours, theirs], now=later))
    deletes = [(a.kind, a.name) for a in decision.actions if isinstance(a, Delete)]
    assert deletes == [("Job", job["metadata"]["name"])]  # ours, and none of the pods: its own has none left
    assert "GoodputMeasured" not in {e.reason for e in decision.events}  # its own pod's summary is missing
    message = cond(stored(status, decision), "ChildrenAdmitted")["message"]
    assert "Job/team-a-probe (uid uid-team-a-probe) carries this PDDeployment's labels" in message
    assert "never read as a probe or deleted" in message
    assert f"Pod/{forged['metadata']['name']}" in message


def test_an_orphan_with_the_replicas_name_labels_and_spec_hash_is_adopted_and_kept() -> None:
    """After `kubectl delete pdd --cascade=orphan` and the same PDDeployment again: its pod serves on,
    adopted (a patch naming its uid) once the PDDeployment is read again, not restarted."""
    snap = snapshot(pods=[pod_of(None)])
    assert decide.owner_read(snap)
    decision = decide.decide(confirmed(snap))
    (adopt,) = [a for a in decision.actions if isinstance(a, Adopt)]
    assert pod_actions(decision) == [f"adopt Pod/{NAME}"]
    assert adopt.patch == {"metadata": {"uid": f"uid-of-{NAME}", "ownerReferences": [render.owner_reference(OWNER)]}}
    assert decision.status.phase == "Ready" and decision.status.pod_name == NAME
    assert "AdoptedPod" in {e.reason for e in decision.events}
    assert cond(stored({}, decision), "ChildrenAdmitted")["status"] == "True"


def test_an_orphan_is_not_adopted_unless_the_owner_is_confirmed_nor_when_the_adoption_fails() -> None:
    snap = snapshot(pods=[pod_of(None)])
    gone = dataclasses.replace(THIS, deleting=True)
    refused = ApiFailure(422, "Invalid", "...", (("metadata.uid", "field is immutable"),))
    for tick in (snap, dataclasses.replace(snap, reread=gone), confirmed(snap)):
        failed = {f"adopt Pod/{NAME}": refused} if tick.reread is THIS else {}
        decision = decide.decide(dataclasses.replace(tick, failed=failed))
        assert pod_actions(decision) == [] and decision.status.phase == "Pending"
        assert cond(stored({}, decision), "ChildrenAdmitted")["reason"] == "NameConflict"


def test_an_orphan_of_another_spec_hash_or_name_is_left_alone() -> None:
    """Adopting it would mean deleting it (to roll it) or keeping what no replica is: neither is the operator's
    to decide about a pod it did not create."""
    stale = pod_of(None, spec={**SPEC, "image": "ghcr.io/pd-serving/pd-runtime:0.0.1"})
    other = pod_of(None, f"{NAME}-3")
    snap = snapshot(pods=[stale, other])
    assert not decide.owner_read(snap)
    decision = decide.decide(dataclasses.replace(snap, reread=THIS))
    assert pod_actions(decision) == []
    message = cond(stored({}, decision), "ChildrenAdmitted")["message"]
    assert f"Pod/{NAME} (uid uid-of-{NAME}) exists and belongs to no owner reference" in message
    assert "an orphan is adopted only with this PDDeployment's labels and the current spec hash" in message
    assert f"Pod/{NAME}-3 (uid uid-of-{NAME}-3) carries this PDDeployment's labels" in message
