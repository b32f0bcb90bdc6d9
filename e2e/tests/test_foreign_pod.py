"""Own by uid, on the real API server: a pod that carries a PDDeployment's labels but another controller (a
ConfigMap of another team) survives the PDDeployment's whole life untouched, and the PDDeployment serves.

The pod is named as the PDDeployment's eighth replica would be and carries every label the operator puts on
its serving pods: selected by label alone, it was deleted as a surplus replica on the first reconcile. It
is never scheduled (a node selector no node matches), so the Service never routes to it. The
PDDeployment becomes Ready, says in ChildrenAdmitted (reason NotOwned) and a Warning Event that it leaves
that pod alone, scales 1 -> 2 -> 1 (a scale-down deletes only its own replica), and is deleted; its pods
are garbage-collected, and the other team's pod is still there with the same uid and owner.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    Obj,
    apply,
    children_admitted,
    create_namespace,
    pdd,
    pdd_events,
    phase,
    pod,
    pods,
    simulated_example,
    wait_for,
)

NAME = "foreign"
THEIRS = f"{NAME}-7"
SERVING = f"pd.serving.dev/deployment={NAME},app.kubernetes.io/component=serving"
LABELS = {
    "app.kubernetes.io/name": "pddeployment",
    "app.kubernetes.io/instance": NAME,
    "app.kubernetes.io/component": "serving",
    "app.kubernetes.io/managed-by": "pd-operator",
    "app.kubernetes.io/part-of": "pd-serving",
    "pd.serving.dev/deployment": NAME,
}
TEAM_CONFIGMAP: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team-a"}, "data": {}}


def their_pod(configmap_uid: str) -> Obj:
    controller = {"apiVersion": "v1", "kind": "ConfigMap", "name": "team-a", "uid": configmap_uid, "controller": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": THEIRS, "labels": LABELS, "ownerReferences": [controller]},
        "spec": {
            "nodeSelector": {"team-a.example/never": "scheduled"},
            "containers": [{"name": "app", "image": "team-a/app"}],
        },
    }


def identity(cp: ControlPlane, ns: str) -> tuple[str, list[Obj], str | None]:
    """Their pod's uid, owner references and deletion timestamp as stored now."""
    found = pod(cp, ns, THEIRS)
    assert found is not None, f"Pod/{THEIRS} is gone"
    meta = found["metadata"]
    return meta["uid"], meta.get("ownerReferences", []), meta.get("deletionTimestamp")


def ours(cp: ControlPlane, ns: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(cp, ns, SERVING) if p["metadata"]["name"] != THEIRS)


def wait_replicas(cp: ControlPlane, ns: str, replicas: int) -> None:
    """Ready for the current generation with ``replicas`` ready, and exactly that many pods of its own."""

    def done() -> bool | None:
        obj = pdd(cp, ns, NAME) or {"metadata": {}}
        status = obj.get("status") or {}
        current = phase(obj) == "Ready" and status.get("observedGeneration") == obj["metadata"].get("generation")
        counted = status.get("readyReplicas") == replicas == status.get("replicas")
        return (current and counted and len(ours(cp, ns)) == replicas) or None

    wait_for(done, 180, f"{replicas} ready replicas of its own")


@pytest.fixture(scope="module")
def ns(operator: Stack, cp: ControlPlane) -> Iterator[str]:
    name = create_namespace(cp, "t-foreign-pod")
    cp.kubectl("create", "-n", name, "-f", "-", input_text=json.dumps(TEAM_CONFIGMAP))
    configmap = json.loads(cp.kubectl("get", "-n", name, "configmap", "team-a", "-o", "json"))
    cp.kubectl("create", "-n", name, "-f", "-", input_text=json.dumps(their_pod(configmap["metadata"]["uid"])))
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_labelled_pod_of_another_owner_survives_the_whole_life_of_a_pddeployment(cp: ControlPlane, ns: str) -> None:
    before = identity(cp, ns)
    assert before[2] is None
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    apply(cp, json.dumps(obj), ns)
    wait_replicas(cp, ns, 1)
    assert ours(cp, ns) == [NAME] and identity(cp, ns) == before
    left_alone = wait_for(lambda: children_admitted(cp, ns, NAME, "False"), 120, "ChildrenAdmitted False")
    assert left_alone["reason"] == "NotOwned", left_alone
    assert (
        f"Pod/{THEIRS} (uid {before[0]}) carries this PDDeployment's labels and belongs to ConfigMap/team-a"
        in left_alone["message"]
    )
    [event] = wait_for(lambda: pdd_events(cp, ns, NAME, "NotOwned"), 60, "a NotOwned Event")
    assert event["type"] == "Warning" and f"Pod/{THEIRS}" in event["message"]

    for replicas in (2, 1):  # the scale-down deletes its own second replica, and nothing else
        cp.kubectl("scale", "-n", ns, "pdd", NAME, f"--replicas={replicas}")
        wait_replicas(cp, ns, replicas)
        assert identity(cp, ns) == before
    assert ours(cp, ns) == [NAME]

    cp.kubectl("delete", "-n", ns, "pdd", NAME, "--wait=true")
    wait_for(lambda: pdd(cp, ns, NAME) is None or None, 60, "the PDDeployment gone")
    wait_for(lambda: not ours(cp, ns) or None, 180, "its own serving pods collected")
    assert identity(cp, ns) == before
