"""Node loss end to end on real nodes: the serving pod's node dies (its kubelet, containerd, shims and
containers killed at once, its link down), the node lifecycle controller of kube-controller-manager marks
it unreachable once its Lease is older than the grace, and past the pod's toleration the operator
force-deletes the pod, which is recreated on the other node of the pool and serves again; an Event and
the NodeLost condition say so. The lost node is torn down afterwards and leaves nothing on the machine."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from e2e import real_node
from e2e.cluster import ControlPlane
from e2e.stack import GPU_POOL, Stack, pool_placement
from e2e.tests.kube import (
    Obj,
    apply,
    condition,
    container_status,
    get,
    pdd,
    pod,
    simulated_example,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

NAME = "lost"
UNREACHABLE = "node.kubernetes.io/unreachable"
TOLERATION_S = 5  # the pod's own tolerationSeconds for the unreachable taint: shorter than the operator's 300 s


def deployment() -> Obj:
    """The simulated write example, requesting its 8 GPUs (so one per node), on the pool's nodes."""
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    obj["spec"]["simulation"]["reserveGpus"] = True
    placement = pool_placement(GPU_POOL)
    placement["tolerations"].append(
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION_S}
    )
    obj["spec"]["node"] = placement
    return obj


def node_state(cp: ControlPlane, name: str) -> tuple[str, list[str]]:
    node = get(cp, f"/api/v1/nodes/{name}") or {}
    ready = next((c["status"] for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"), "")
    return ready, [t["key"] for t in node.get("spec", {}).get("taints") or []]


def events(cp: ControlPlane, namespace: str, reason: str) -> list[Obj]:
    selector = f"involvedObject.kind=PDDeployment,involvedObject.name={NAME},reason={reason}"
    listing = get(cp, f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}") or {}
    found: list[Obj] = listing.get("items", [])
    return found


def answers(pod_ip: str) -> bool:
    """Whether the pod's proxy still answers at all (any status): False once the machine is gone."""
    try:
        httpx.get(f"http://{pod_ip}:8000/health", timeout=5, trust_env=False)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.timeout(480)  # the real cluster's session setup (images, control plane, chart) may fall in it
def test_serving_pod_of_a_lost_node_is_recreated_on_a_node_with_free_gpus(
    stack: Stack, cp: ControlPlane, namespace: str, real_pool: Callable[[str, int], list[str]]
) -> None:
    nodes = real_pool(GPU_POOL, 2)
    apply(cp, json.dumps(deployment()), namespace)
    first = wait_pdd_ready(cp, namespace, NAME, timeout_s=120)["status"]
    lost_node, lost_pod = first["nodeName"], pod(cp, namespace, first["podName"])
    assert lost_node in nodes and lost_pod is not None
    assert stream_completion(first["podIP"])
    assert condition(pdd(cp, namespace, NAME), "NodeLost") is None, "no condition while nodes are fine"

    stack.fail_node(lost_node)
    wait_for(lambda: not answers(first["podIP"]), 30, f"the pods of {lost_node} to stop answering")
    wait_for(
        lambda: node_state(cp, lost_node)[0] == "Unknown" and UNREACHABLE in node_state(cp, lost_node)[1],
        90,
        f"node lifecycle controller to mark {lost_node} Unknown and taint it unreachable",
    )

    def replaced() -> Obj | None:
        obj = pdd(cp, namespace, NAME)
        status = (obj or {}).get("status", {})
        moved = status.get("podUid") not in (None, lost_pod["metadata"]["uid"])
        return obj if moved and status.get("phase") == "Ready" else None

    now = wait_for(replaced, 120, "the serving pod recreated on another node and Ready")["status"]
    other = next(n for n in nodes if n != lost_node)
    assert now["nodeName"] == other and now["podName"] == lost_pod["metadata"]["name"]
    assert container_status(pod(cp, namespace, now["podName"]), "proxy")["containerID"].startswith("containerd://")
    assert stream_completion(now["podIP"])

    lost = events(cp, namespace, "NodeLost")
    assert len(lost) == 1 and lost[0]["type"] == "Warning", lost
    message = lost[0]["message"]
    assert f"node {lost_node} is unreachable since" in message and f"past the {TOLERATION_S:g}s grace" in message
    assert "force-deleted (zero grace)" in message
    found = wait_for(
        lambda: (c := condition(pdd(cp, namespace, NAME), "NodeLost")) and c["reason"] == "Recovered" and c,
        30,
        "NodeLost False (Recovered)",
    )
    assert found["status"] == "False" and found["message"] == f"the serving pod {NAME} is Ready on node {other}"
    cp.kubectl("delete", "pdd", NAME, "-n", namespace, "--wait=false")

    assert real_node.leftovers(stack.remove_real_node(lost_node)) == []
