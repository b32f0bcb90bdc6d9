"""Own what you touch: a child of a rendered name that another owner holds is never applied (taken over),
the status and an Event say so, and serving goes on where it can. Pure decisions over what the shell read."""

from __future__ import annotations

import dataclasses
from typing import Any

from pd_operator import decide, render
from pd_operator.decide import Apply, Create, Decision, Snapshot
from pd_operator.refusals import ApiFailure, refusal
from pd_operator.views import ObjectView, OwnerRef
from tests.operator.test_decide import NAME, OWNER, SPEC, UID, cond, snapshot, stored

FOREIGN = (OwnerRef("Deployment", "team-a", "uid-team-a"),)
OURS = (OwnerRef("PDDeployment", NAME, UID),)
ROUTED: dict[str, Any] = {**SPEC, "router": {"enabled": True}}


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


def test_children_of_ours_and_known_ones_are_applied_with_their_uid_as_precondition() -> None:
    service, policy = f"Service/{NAME}", f"NetworkPolicy/{NAME}"
    snap = dataclasses.replace(seeing(**{service: view(service, owners=OURS)}), known={policy: "uid-known"})
    objs = applied(decide.decide(snap))
    assert objs[service]["metadata"]["uid"] == f"uid-of-{NAME}" and objs[policy]["metadata"]["uid"] == "uid-known"
    assert "uid" not in objs[f"PodDisruptionBudget/{NAME}"]["metadata"]  # absent: created by the apply
    assert cond(stored({}, decide.decide(snap)), "ChildrenAdmitted")["status"] == "True"


def test_what_pdctl_render_made_for_this_deployment_is_adopted() -> None:
    """No owner reference and labelled as this PDDeployment's by pd-operator: `pdctl render | kubectl apply`."""
    key = f"Service/{NAME}"
    decision = decide.decide(seeing(**{key: view(key, owners=(), labels=render.labels(OWNER, "serving"))}))
    assert applied(decision)[key]["metadata"]["uid"] == f"uid-of-{NAME}"
    other = render.labels(dataclasses.replace(OWNER, name="other"), "serving")
    assert key not in applied(decide.decide(seeing(**{key: view(key, owners=(), labels=other)})))


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
