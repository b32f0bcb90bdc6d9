"""Admission as production runs it: Pod Security labels on namespaces, OwnerReferencesPermissionEnforcement.

The API server of the suite runs OwnerReferencesPermissionEnforcement, so every child the operator
creates (with ``blockOwnerDeletion``) passes only because the chart grants update on
``pddeployments/finalizers``. Here a pod refused by Pod Security shows as the ChildrenAdmitted condition
and a ChildRefused Event naming the policy and the fields, and clears once the namespace allows it. The
Pod Security level each GPU strategy and KV backend needs is measured by dry-run creates of the
rendered pods in namespaces enforcing each level, against the table in docs/gpu-allocation.md.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import pytest

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.resourceslices import Gpu, pci_address
from e2e.stack import Stack
from e2e.tests.kube import (
    POD_SECURITY,
    Obj,
    PodSecurityLevel,
    apply,
    children_admitted,
    create_namespace,
    get,
    pdd,
    pdd_events,
    wait_for,
)
from pd_operator import layout, render
from pd_operator.validation import validate_spec

LEVELS: tuple[PodSecurityLevel, ...] = ("restricted", "baseline", "privileged")  # strictest first
NO_NODE = {"pd.serving.dev/e2e": "no-such-node"}  # the pods must never run: they would take the node's GPUs
RDMA = {"rdma": {"resourceName": "rdma/hca_shared_devices_a"}}
DRA = {"strategy": "dra", "dra": {"pciAddresses": [pci_address(Gpu(i)) for i in range(8)]}}  # required for dra
# The rows of docs/gpu-allocation.md's table, by their first cell.
CASES: dict[str, dict[str, Any]] = {
    "vllm devicePlugin rdma": {"kvTransfer": RDMA},
    "vllm devicePlugin rdma hostNetwork": {"kvTransfer": {"rdma": {**RDMA["rdma"], "hostNetwork": True}}},
    "vllm devicePlugin colocated": {"mode": "colocated"},
    "vllm dra rdma": {"gpuAllocation": DRA, "kvTransfer": RDMA},
    "vllm dra colocated": {"gpuAllocation": DRA, "mode": "colocated"},
    "vllm hostDevices rdma": {"gpuAllocation": {"strategy": "hostDevices"}},
    "vllm hostDevices xgmi": {"gpuAllocation": {"strategy": "hostDevices"}, "kvTransfer": {"backend": "xgmi"}},
    "simulated devicePlugin": {"engine": "simulated", "simulation": {"reserveGpus": True}},
    "simulated hostDevices": {
        "engine": "simulated",
        "simulation": {"reserveGpus": True},
        "gpuAllocation": {"strategy": "hostDevices"},
    },
    "simulated modelStorage.hostPath": {"engine": "simulated", "modelStorage": {"hostPath": "/models"}},
}


def documented_levels() -> dict[str, str]:
    """`case` -> level from the table in docs/gpu-allocation.md (rows whose first cell is a case id)."""
    text = (REPO_ROOT / "docs" / "gpu-allocation.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| \*\*(\w+)\*\* \|$", text, re.M)
    return dict(rows)


def dry_run_create(cp: ControlPlane, namespace: str, obj: Obj) -> tuple[int, str]:
    with cp.http() as client:
        resp = client.post(f"/api/v1/namespaces/{namespace}/pods", params={"dryRun": "All"}, json=obj)
    return resp.status_code, resp.text


def rendered_pod(case: str, namespace: str) -> Obj:
    spec = {"model": "m", "node": {"nodeSelector": NO_NODE}, **CASES[case]}
    return render.pod(layout.build(layout.Owner(name="level", namespace=namespace), validate_spec(spec)))


def test_pod_security_levels_are_the_documented_ones(cp: ControlPlane) -> None:
    """Each case's pod is admitted exactly from the level the docs state (and refused by the stricter ones)."""
    suffix = secrets.token_hex(3)
    namespaces = {level: create_namespace(cp, f"pss-{level}-{suffix}", level) for level in LEVELS}
    try:
        measured: dict[str, str] = {}
        refusals: dict[str, str] = {}
        for case in CASES:
            for level in LEVELS:
                code, body = dry_run_create(cp, namespaces[level], rendered_pod(case, namespaces[level]))
                assert code in (201, 403), body
                if code == 201:
                    measured[case] = level
                    break
                refusals[f"{case} @ {level}"] = json.loads(body)["message"]
        assert measured == documented_levels(), json.dumps(refusals, indent=1)
    finally:
        for namespace in namespaces.values():
            cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.pod_security("baseline")
def test_a_pod_refused_by_pod_security_is_a_condition_and_an_event(
    operator: Stack, cp: ControlPlane, namespace: str
) -> None:
    """hostDevices runs privileged engines: a baseline namespace refuses the pod, and the user reads why."""
    obj = {
        "apiVersion": "pd.serving.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "privileged"},
        "spec": {"model": "m", "gpuAllocation": {"strategy": "hostDevices"}, "node": {"nodeSelector": NO_NODE}},
    }
    apply(cp, json.dumps(obj), namespace)
    refused = wait_for(lambda: children_admitted(cp, namespace, "privileged", "False"), 60, "ChildrenAdmitted False")
    assert refused["reason"] == "PodSecurity", refused
    assert refused["message"].startswith('Pod/privileged refused by PodSecurity "baseline:latest": '), refused
    assert "securityContext.privileged=true" in refused["message"], refused
    [event] = wait_for(lambda: pdd_events(cp, namespace, "privileged", "ChildRefused"), 30, "a ChildRefused Event")
    assert event["type"] == "Warning" and event["message"] == refused["message"]
    status = (pdd(cp, namespace, "privileged") or {})["status"]
    assert status["phase"] == "Pending" and "cannot create the serving pod" in status["message"]
    # The Service and NetworkPolicy (with blockOwnerDeletion) were admitted under the chart's RBAC.
    for path in ("/api/v1", "/apis/networking.k8s.io/v1"):
        kind = "services" if path == "/api/v1" else "networkpolicies"
        child = get(cp, f"{path}/namespaces/{namespace}/{kind}/privileged")
        assert child is not None and child["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    # The user allows privileged pods in the namespace: the pod is created and the condition clears.
    cp.kubectl("label", "namespace", namespace, f"{POD_SECURITY}/enforce=privileged", "--overwrite")
    wait_for(lambda: children_admitted(cp, namespace, "privileged", "True"), 60, "ChildrenAdmitted True")
    assert get(cp, f"/api/v1/namespaces/{namespace}/pods/privileged") is not None
