"""spec.router: the operator's router Deployment in front of two replicas (with its NetworkPolicy and
PodDisruptionBudget), its ready pods in the PDDeployment's status (status.router, RouterReady), a
completion streamed through each router pod, and disabling it removes every router object and that status.

The router pods are real Deployment pods (the controller-manager makes the ReplicaSet and its pods, the
node's kubelet runs them), find the replicas by watching the PDDeployment Service's EndpointSlices with their
own ServiceAccount token (so the operator-rendered Role is what lets them), and read each replica's admin
/status through the serving NetworkPolicy's router rule.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import httpx
import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    Obj,
    apply,
    condition,
    create_namespace,
    get,
    pdd,
    pdd_events,
    ready_addresses,
    simulated_example,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

NAME = "rt"
ROUTER = f"{NAME}-router"
ROUTER_OBJECTS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/" + ROUTER,
    "Service": "/api/v1/namespaces/{ns}/services/" + ROUTER,
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/" + ROUTER,
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/" + ROUTER,
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/" + ROUTER,
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/" + ROUTER,
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/" + ROUTER,
}
ROUTER_UP = ("True", "RouterAvailable", "2/2 router pods ready")


@pytest.fixture(scope="module")
def ns(operator: Stack, cp: ControlPlane) -> Iterator[str]:
    name = create_namespace(cp, "t-router")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


def manifest(router: bool) -> str:
    obj = simulated_example(NAME)
    obj["spec"]["replicas"] = 2
    obj["spec"]["goodputProbe"]["enabled"] = False
    obj["spec"]["router"] = {"enabled": router}
    return yaml.safe_dump(obj)


def router_status(ip: str) -> Obj:
    status: Obj = httpx.get(f"http://{ip}:8000/status", timeout=5, trust_env=False).json()
    return status


def exactly(expected: int, values: list[str]) -> list[str] | None:
    """The values once there are as many as expected (EndpointSlices and router watches catch up at their pace)."""
    return values if len(values) == expected else None


def owners(cp: ControlPlane, path: str) -> list[tuple[str, str]] | None:
    obj = get(cp, path)
    return None if obj is None else [(r["kind"], r["uid"]) for r in obj["metadata"].get("ownerReferences") or []]


def budget_counts(cp: ControlPlane, ns: str, pods: int) -> bool | None:
    budget = get(cp, ROUTER_OBJECTS["PodDisruptionBudget"].format(ns=ns)) or {}
    status = budget.get("status") or {}
    counted = (status.get("expectedPods"), status.get("currentHealthy"), status.get("disruptionsAllowed"))
    return counted == (pods, pods, 1) or None


def sees(router_ip: str, replicas: list[str]) -> bool | None:
    return sorted(r["address"] for r in router_status(router_ip)["replicas"]) == replicas or None


def router_reported(cp: ControlPlane, ns: str) -> bool | None:
    """Whether the status shows both router pods ready (the operator reads the Deployment every tick)."""
    obj = pdd(cp, ns, NAME) or {}
    cond = condition(obj, "RouterReady") or {}
    said = (cond.get("status"), cond.get("reason"), cond.get("message"))
    counts = (obj.get("status") or {}).get("router")
    return (counts == {"replicas": 2, "readyReplicas": 2, "ready": "2/2"} and said == ROUTER_UP) or None


def router_status_gone(cp: ControlPlane, ns: str) -> bool | None:
    obj = pdd(cp, ns, NAME) or {}
    return ("router" not in (obj.get("status") or {}) and condition(obj, "RouterReady") is None) or None


def test_router_serves_both_replicas_and_goes_when_disabled(cp: ControlPlane, ns: str) -> None:
    apply(cp, manifest(router=True), ns)
    owner = wait_pdd_ready(cp, ns, NAME, timeout_s=300)
    for kind, path in ROUTER_OBJECTS.items():
        refs = wait_for(functools.partial(owners, cp, path.format(ns=ns)), 120, f"router {kind}")
        assert refs == [("PDDeployment", owner["metadata"]["uid"])], (kind, refs)

    def deployment_ready() -> Obj | None:
        dep = get(cp, ROUTER_OBJECTS["Deployment"].format(ns=ns)) or {}
        return dep if (dep.get("status") or {}).get("readyReplicas") == 2 else None

    dep = wait_for(deployment_ready, 300, "router Deployment with 2 ready pods")
    wait_for(functools.partial(router_reported, cp, ns), 180, "status.router 2/2 ready and RouterReady True")
    # it became True at some tick: that transition posted a RouterReady Event
    wait_for(lambda: pdd_events(cp, ns, NAME, "RouterReady"), 120, "a RouterReady Event")
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(anti) == ["preferredDuringSchedulingIgnoredDuringExecution"], anti
    # the disruption controller counts exactly the router pods (not the serving ones) under the budget
    wait_for(functools.partial(budget_counts, cp, ns, 2), 180, "the router budget to count 2 healthy router pods")
    policy = get(cp, ROUTER_OBJECTS["NetworkPolicy"].format(ns=ns)) or {}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], policy
    routers = wait_for(lambda: exactly(2, ready_addresses(cp, ns, ROUTER)), 180, "2 ready router endpoints")
    serving = wait_for(lambda: exactly(2, ready_addresses(cp, ns, NAME)), 180, "2 ready serving endpoints")
    expected = [f"{a}:8000" for a in serving]
    for ip in routers:
        # each router finds both replicas through its own EndpointSlice watch
        wait_for(functools.partial(sees, ip, expected), 180, f"router {ip} seeing replicas {expected}")
        assert stream_completion(ip), f"empty completion through router {ip}"
    routed = [r["routed"] for r in router_status(routers[0])["replicas"]]
    assert sum(routed) >= 1, routed

    apply(cp, manifest(router=False), ns)

    def router_gone() -> bool | None:
        left = [kind for kind, path in ROUTER_OBJECTS.items() if get(cp, path.format(ns=ns)) is not None]
        return not left or None

    wait_for(router_gone, 180, "every router object deleted after spec.router.enabled: false")
    wait_for(functools.partial(router_status_gone, cp, ns), 180, "status.router and RouterReady removed")
