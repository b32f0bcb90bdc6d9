"""Own what you touch, on the real API server: objects of rendered names that another team holds survive
a PDDeployment's whole life untouched, and the status says why the operator could not create its own.

Before the PDDeployment exists: another team's Deployment NAME-router (the router is disabled, the
default, so the operator looks for a leftover router of that name) and a Service NAME (the name of the
PDDeployment's own Service). The deployment serves without its Service, ChildrenAdmitted is False with
reason NameConflict and a Warning Event names the Service and its holder; after the PDDeployment is
deleted and its children are garbage-collected, both objects are still there, with the same uid and
no owner reference added. Also: the server-side apply precondition the operator relies on (an apply
naming another uid is refused, on ``metadata.uid``; one naming a uid where no object is creates none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    GROUP_PATH,
    Obj,
    apply,
    children_admitted,
    create_namespace,
    get,
    pdd,
    pdd_events,
    pods,
    simulated_example,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

NAME = "owned"
SERVING = f"pd.serving.dev/deployment={NAME},app.kubernetes.io/component=serving"
TEAM = {"team": "a"}
THEIR_SERVICE: Obj = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": NAME, "labels": TEAM},
    "spec": {"selector": TEAM, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
}
THEIR_ROUTER: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": f"{NAME}-router", "labels": TEAM},
    "spec": {
        "replicas": 0,  # never runs: only its presence matters
        "selector": {"matchLabels": TEAM},
        "template": {"metadata": {"labels": TEAM}, "spec": {"containers": [{"name": "app", "image": "team-a/app"}]}},
    },
}


def path(ns: str, obj: Obj) -> str:
    root = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    plural = {"Service": "services", "Deployment": "deployments"}[obj["kind"]]
    return f"{root}/namespaces/{ns}/{plural}/{obj['metadata']['name']}"


def identity(cp: ControlPlane, ns: str, obj: Obj) -> tuple[str, list[Obj], Obj]:
    """uid, owner references and spec of the object as stored now."""
    found = get(cp, path(ns, obj))
    assert found is not None, f"{obj['kind']}/{obj['metadata']['name']} is gone"
    return found["metadata"]["uid"], found["metadata"].get("ownerReferences", []), found["spec"]


@pytest.fixture(scope="module")
def ns(operator: Stack, cp: ControlPlane) -> Iterator[str]:
    name = create_namespace(cp, "t-ownership")
    for obj in (THEIR_SERVICE, THEIR_ROUTER):
        cp.kubectl("create", "-n", name, "-f", "-", input_text=json.dumps(obj))
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_server_side_apply_naming_another_uid_is_refused_on_metadata_uid(cp: ControlPlane, ns: str) -> None:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": ns, "uid": "not-its-uid"},
    }
    with cp.http() as client:
        resp = client.patch(
            path(ns, THEIR_SERVICE),
            params={"fieldManager": "pd-operator", "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
            content=json.dumps(body),
        )
    assert resp.status_code == 422, resp.text
    causes = resp.json().get("details", {}).get("causes", [])
    assert any(c.get("field") == "metadata.uid" for c in causes), resp.text
    missing = {**body, "metadata": {**body["metadata"], "name": "nobody"}}
    with cp.http() as client:
        resp = client.patch(
            f"/api/v1/namespaces/{ns}/services/nobody",
            params={"fieldManager": "pd-operator", "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
            content=json.dumps({**missing, "spec": {"ports": [{"port": 80}]}}),
        )
    # a uid naming no object creates nothing: the child the operator applied was deleted meanwhile
    assert resp.status_code == 409 and "uid mismatch" in resp.json()["message"], resp.text


def test_objects_of_other_owners_survive_the_whole_life_of_a_pddeployment(cp: ControlPlane, ns: str) -> None:
    before = {obj["kind"]: identity(cp, ns, obj) for obj in (THEIR_SERVICE, THEIR_ROUTER)}
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    apply(cp, yaml.safe_dump(obj), ns)
    wait_pdd_ready(cp, ns, NAME, timeout_s=300)  # as Ready as it can be: it serves, without its Service
    (serving,) = pods(cp, ns, SERVING)
    assert stream_completion(serving["status"]["podIP"])
    conflict = wait_for(lambda: children_admitted(cp, ns, NAME, "False"), 120, "ChildrenAdmitted False")
    assert conflict["reason"] == "NameConflict", conflict
    assert (
        f"Service/{NAME} (uid {before['Service'][0]}) exists and belongs to no owner reference" in (conflict["message"])
    )
    assert "serving goes on without its Service" in conflict["message"]
    [event] = wait_for(lambda: pdd_events(cp, ns, NAME, "NameConflict"), 60, "a NameConflict Event")
    assert event["type"] == "Warning" and f"Service/{NAME}" in event["message"]
    assert {kind: identity(cp, ns, o) for kind, o in (("Service", THEIR_SERVICE), ("Deployment", THEIR_ROUTER))} == (
        before
    )

    cp.kubectl("delete", "-n", ns, "pdd", NAME, "--wait=true")
    wait_for(lambda: pdd(cp, ns, NAME) is None or None, 60, "the PDDeployment gone")
    gone = f"{GROUP_PATH}/namespaces/{ns}/pddeployments/{NAME}"
    assert get(cp, gone) is None
    # its own children are garbage-collected (the ConfigMap is one); the other team's objects stay as they were
    wait_for(lambda: get(cp, f"/api/v1/namespaces/{ns}/configmaps/{NAME}-proxy") is None or None, 120, "GC")
    wait_for(lambda: not pods(cp, ns, SERVING) or None, 180, "the serving pod collected")
    assert {kind: identity(cp, ns, o) for kind, o in (("Service", THEIR_SERVICE), ("Deployment", THEIR_ROUTER))} == (
        before
    )
