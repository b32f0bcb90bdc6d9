"""spec.autoscaling on a real API server: demand read from the running proxy, replicas written through the
scale subresource with the chart's RBAC, and the HPA recipe of docs/autoscaling.md applied as written, after
which the operator leaves replicas to the HPA (one owner of replicas) and the HPA, through the control
plane's real HPA controller and an aggregated external metrics API (e2e/metrics_api.py), sets them from
the desired replicas the operator publishes. Every YAML block of the recipe passes a server-side dry run."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import Obj, apply, condition, get, pdd, pdd_events, simulated_example, stream_completion, wait_for

NAME = "sim-write"  # the name the recipe's HPA targets
DOC = REPO_ROOT / "docs" / "autoscaling.md"
SECTION = "## Using an HPA or KEDA instead"
KEDA_CRD = "keda.sh_scaledobjects.yaml"


def recipe() -> list[Obj]:
    """The YAML blocks of docs/autoscaling.md's HPA/KEDA section, as written (the recipe users copy)."""
    section = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```$", section, re.M | re.S)
    docs = [doc for _, block in blocks for doc in yaml.safe_load_all(textwrap.dedent(block)) if doc]
    assert {d["kind"] for d in docs} == {"ConfigMap", "HorizontalPodAutoscaler", "ScaledObject"}, docs
    return docs


def recipe_object(kind: str) -> Obj:
    (found,) = [d for d in recipe() if d["kind"] == kind]
    return found


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
    hpa = recipe_object("HorizontalPodAutoscaler")
    apply(cp, json.dumps(hpa), namespace)

    def owned_elsewhere() -> Obj | None:
        found = pdd(cp, namespace, NAME)
        return found if _scaling(found) == ("False", "ReplicasOwnedElsewhere") else None

    owned = wait_for(owned_elsewhere, timeout_s=60, what="ScalingActive False ReplicasOwnedElsewhere")
    assert f"HorizontalPodAutoscaler {NAME}" in str(condition(owned, "ScalingActive"))
    inactive = [e["message"] for e in pdd_events(cp, namespace, NAME, "ScalingInactive")]
    assert any("no capacity yet" in m for m in inactive) and any("HorizontalPodAutoscaler" in m for m in inactive)

    # The HPA, through the real HPA controller and the aggregated external metrics API, follows the
    # replicas the operator publishes (here its bounds: no capacity yet) and writes them via /scale.
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{NAME}"
    with operator.external_metrics():

        def hpa_reads(desired: int) -> Obj | None:
            found = get(cp, hpa_path) or {}
            status = found.get("status") or {}
            current = [m["external"]["current"] for m in status.get("currentMetrics") or [] if m.get("external")]
            return found if current and status.get("desiredReplicas") == desired else None

        wait_for(lambda: hpa_reads(2), timeout_s=90, what="the HPA reading pd_operator_desired_replicas 2")
        cp.kubectl(
            "patch", "pdd", NAME, "-n", namespace, "--type=merge", "-p", '{"spec":{"autoscaling":{"minReplicas":3}}}'
        )
        scaled = wait_for(lambda: hpa_reads(3), timeout_s=90, what="the HPA asking 3 replicas")
        wait_for(
            lambda: ((get(cp, scale) or {}).get("spec") or {}).get("replicas") == 3,
            timeout_s=60,
            what="the HPA's 3 replicas through the scale subresource",
        )
        assert condition(scaled, "AbleToScale") and condition(scaled, "ScalingActive"), scaled["status"]
        assert (condition(scaled, "ScalingActive") or {}).get("status") == "True", scaled["status"]
        rescaled = cp.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "-o",
            "json",
            f"--field-selector=involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={NAME},reason=SuccessfulRescale",
        )
        messages = [e["message"] for e in json.loads(rescaled)["items"]]
        assert any("New size: 3" in m and "pd_operator_desired_replicas" in m for m in messages), messages
        table = cp.kubectl("get", "hpa", NAME, "-n", namespace)  # what `kubectl get hpa` users see
        assert f"PDDeployment/{NAME}" in table and "/1 (avg)" in table, table
        # One owner: the operator wrote none of it and says whose replicas they are, and what it advises.
        owned = wait_for(owned_elsewhere, timeout_s=30, what="ScalingActive still ReplicasOwnedElsewhere")
        assert "desired replicas 3 (" in str(condition(owned, "ScalingActive")), owned["status"]
        assert [e["message"] for e in pdd_events(cp, namespace, NAME, "ScaledToBounds")] == [events[0]["message"]]
        assert (owned["status"].get("autoscaling") or {}).get("desiredReplicas") == 3

    # The goodput probe on (its SLO), no search yet: the planner's capacity for this layout, and an Event.
    probe = {"enabled": True, "promptTokens": 200, "outputTokens": 20, "requests": 20, "intervalSeconds": 3600}
    cp.kubectl(
        "patch", "pdd", NAME, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"goodputProbe": probe}})
    )

    def predicted() -> Obj | None:
        found = ((pdd(cp, namespace, NAME) or {}).get("status") or {}).get("capacity") or {}
        return found if found.get("source") == "predicted" and float(found["requestsPerSecond"]) > 0 else None

    capacity = wait_for(predicted, timeout_s=90, what="status.capacity predicted by the planner")
    assert "the planner's prediction for this layout at 200/20 tokens" in capacity["message"], capacity
    noted = [e["message"] for e in pdd_events(cp, namespace, NAME, "CapacityPredicted")]
    assert noted and "(predicted)" in noted[0], noted


@pytest.fixture(scope="module")
def keda_crd(operator: Stack) -> ControlPlane:
    script = REPO_ROOT / "e2e" / "fetch-crds.sh"
    out = subprocess.run(["bash", str(script), "keda"], check=True, capture_output=True, text=True, timeout=600)
    cp = operator.cp
    cp.kubectl("apply", "--server-side", "-f", str(Path(out.stdout.strip().splitlines()[-1]) / KEDA_CRD))
    cp.kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=60s")
    return cp


def test_every_yaml_block_of_the_recipe_passes_a_server_side_dry_run(keda_crd: ControlPlane, namespace: str) -> None:
    adapter = yaml.safe_load(recipe_object("ConfigMap")["data"]["config.yaml"])
    (rule,) = adapter["externalRules"]
    metric = recipe_object("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert rule["seriesQuery"].strip("'") == metric, (rule, metric)  # the adapter serves what the HPA asks
    assert "pd_operator_desired_replicas" in recipe_object("ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    for obj in recipe():
        result = subprocess.run(
            [keda_crd.tool("kubectl"), "apply", "--dry-run=server", "-n", namespace, "-f", "-"],
            env=keda_crd.env(),
            input=yaml.safe_dump(obj),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and "(server dry run)" in result.stdout, (obj["kind"], result.stderr)
