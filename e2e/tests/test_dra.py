"""DRA on the real scheduler: the node agent publishes its GPUs as the AMD DRA driver does, the claim
template selects them by PCI address, a changed template is replaced under a new name (the pod rolls
onto it, the old one goes), and status.gpuAssignment is what the ResourceClaim was allocated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import ControlPlane
from e2e.devices import Gpu
from e2e.resourceslices import device_name, pci_address
from e2e.stack import Stack
from e2e.tests.kube import apply, create_namespace, get, pdd, simulated_example, wait_for, wait_pdd_ready

NAME = "dra"
PCI = [pci_address(Gpu(i)) for i in range(8)]


@pytest.fixture(scope="module")
def deployed(operator: Stack) -> Iterator[str]:
    cp = operator.cp
    operator.install_operator(values={"rbac.dynamicResourceAllocation": "true"})  # opt-in DRA rights
    namespace = "pd-dra"
    create_namespace(cp, namespace)
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    obj["spec"]["simulation"]["reserveGpus"] = True  # request GPUs as engine vllm would: here through DRA
    obj["spec"]["gpuAllocation"] = {"strategy": "dra", "dra": {"pciAddresses": PCI}}
    apply(cp, json.dumps(obj), namespace)
    wait_pdd_ready(cp, namespace, NAME, timeout_s=180)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    operator.install_operator()  # the suite's default grants again


def _templates(cp: ControlPlane, namespace: str) -> list[str]:
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    listing = get(cp, f"{path}?labelSelector=pd.serving.dev/deployment={NAME}") or {}
    return sorted(t["metadata"]["name"] for t in listing.get("items", []))


def _allocated(obj: dict[str, Any], gpus: range) -> str:
    return ",".join(device_name(Gpu(i)) for i in gpus)


def _assignment(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    obj = pdd(cp, namespace, NAME)
    assert obj is not None
    found: dict[str, Any] = obj["status"]["gpuAssignment"]
    return found


def test_the_scheduler_allocates_the_pinned_gpus_and_status_reads_them_back(cp: ControlPlane, deployed: str) -> None:
    def allocated() -> dict[str, Any] | None:
        found = _assignment(cp, deployed)
        return found if found.get("allocated") else None

    found = wait_for(allocated, 60, "the ResourceClaim's allocation in status")
    assert found["strategy"] == "dra" and found["claim"]
    assert found["prefill"] == _allocated(found, range(0, 4)) and found["decode"] == _allocated(found, range(4, 8))
    claim = get(cp, f"/apis/resource.k8s.io/v1/namespaces/{deployed}/resourceclaims/{found['claim']}")
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(d["request"], d["device"]) for d in found["allocated"]] == [(r["request"], r["device"]) for r in results]


def test_a_changed_template_is_rolled_under_a_new_name(cp: ControlPlane, deployed: str) -> None:
    (before,) = _templates(cp, deployed)
    pod_before = pdd(cp, deployed, NAME)["status"]["podUid"]  # type: ignore[index]
    patch = {"spec": {"prefill": {"gpus": "4-7"}, "decode": {"gpus": "0-3"}}}  # swap the quads
    cp.kubectl("patch", "pdd", NAME, "-n", deployed, "--type=merge", "-p", json.dumps(patch))
    obj = wait_pdd_ready(cp, deployed, NAME, timeout_s=180)
    assert obj["status"]["podUid"] != pod_before, "the pod was rolled onto the new template"
    pod = get(cp, f"/api/v1/namespaces/{deployed}/pods/{obj['status']['podName']}")
    assert pod is not None
    (claim_ref,) = pod["spec"]["resourceClaims"]
    assert claim_ref["resourceClaimTemplateName"] != before
    wait_for(lambda: _templates(cp, deployed) == [claim_ref["resourceClaimTemplateName"]], 60, "the old template gone")

    def swapped() -> dict[str, Any] | None:
        found = _assignment(cp, deployed)
        return found if found.get("prefill") == _allocated(found, range(4, 8)) else None

    found = wait_for(swapped, 60, "the new allocation in status")
    assert found["decode"] == _allocated(found, range(0, 4))
