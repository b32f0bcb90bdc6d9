"""spec.autoscaling on a real API server: demand read from the running proxy, replicas written through the
scale subresource with the chart's RBAC, and the HPA recipe of docs/autoscaling.md applied as written, after
which the operator leaves replicas to the HPA (one owner of replicas)."""

from __future__ import annotations

import json

import yaml

from e2e.cluster import REPO_ROOT
from e2e.stack import Stack
from e2e.tests.kube import Obj, apply, condition, get, pdd, pdd_events, simulated_example, stream_completion, wait_for

NAME = "sim-write"  # the name the recipe's HPA targets
RECIPE = REPO_ROOT / "examples" / "autoscaling" / "hpa.yaml"


def _scaling(obj: Obj | None) -> tuple[str, str]:
    cond = condition(obj, "ScalingActive") or {}
    return str(cond.get("status", "")), str(cond.get("reason", ""))


def test_demand_is_read_replicas_go_through_the_scale_subresource_and_an_hpa_takes_over(
    operator: Stack, namespace: str
) -> None:
    cp = operator.cp
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}  # no measured capacity: the operator must say so
    obj["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3}
    apply(cp, json.dumps(obj), namespace)

    def no_capacity_yet() -> Obj | None:
        found = pdd(cp, namespace, NAME)
        demand = ((found or {}).get("status") or {}).get("demand") or {}
        return found if _scaling(found) == ("False", "NoCapacity") and demand.get("replicasReporting") == 1 else None

    wait_for(no_capacity_yet, timeout_s=240, what="ScalingActive NoCapacity with the proxy's demand in status")
    pod_ip = wait_for(lambda: (pdd(cp, namespace, NAME) or {}).get("status", {}).get("podIP"), 30, "pod IP")
    assert stream_completion(pod_ip)  # a client request: the proxy's demand window counts it

    def demand_seen() -> Obj | None:
        demand = ((pdd(cp, namespace, NAME) or {}).get("status") or {}).get("demand") or {}
        return demand if float(demand.get("requestsPerSecond", 0)) > 0 else None

    demand = wait_for(demand_seen, timeout_s=60, what="status.demand counting the request")
    assert demand["meanOutputTokens"] and demand["summary"]

    # Bounds raised above spec.replicas: the operator writes replicas itself, through pddeployments/scale.
    patch = {"spec": {"autoscaling": {"minReplicas": 2}}}
    cp.kubectl("patch", "pdd", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    scale = f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments/{NAME}/scale"
    wait_for(
        lambda: ((get(cp, scale) or {}).get("spec") or {}).get("replicas") == 2,
        timeout_s=60,
        what="replicas 2 through the scale subresource",
    )
    events = pdd_events(cp, namespace, NAME, "ScaledToBounds")
    assert events and "1 -> 2" in events[0]["message"]

    # The recipe's HPA targets this PDDeployment: the operator stops writing replicas and says why.
    recipe = yaml.safe_load(RECIPE.read_text())
    apply(cp, json.dumps(recipe), namespace)

    def owned_elsewhere() -> Obj | None:
        found = pdd(cp, namespace, NAME)
        return found if _scaling(found) == ("False", "ReplicasOwnedElsewhere") else None

    owned = wait_for(owned_elsewhere, timeout_s=60, what="ScalingActive False ReplicasOwnedElsewhere")
    assert f"HorizontalPodAutoscaler {NAME}" in str(condition(owned, "ScalingActive"))
    inactive = [e["message"] for e in pdd_events(cp, namespace, NAME, "ScalingInactive")]
    assert any("no capacity yet" in m for m in inactive) and any("HorizontalPodAutoscaler" in m for m in inactive)
