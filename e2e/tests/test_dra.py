"""DRA on a real node: the fake AMD GPU DRA driver (e2e/dra_driver.py) registers with the node's kubelet
and publishes the node's GPUs as the AMD driver does; the real scheduler allocates the claim of the
operator's template (GPUs pinned by PCI address), the node's kubelet has the driver prepare it before the
pod starts and unprepare it once the pod is gone; a changed template is replaced under a new name (the
pod rolls onto it, the old one goes), and status.gpuAssignment is what the ResourceClaim was allocated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import dra_driver
from e2e.cluster import ControlPlane
from e2e.node_config import NodeLayout
from e2e.resourceslices import DRIVER, Gpu, device_name, devices, pci_address
from e2e.stack import Stack, pool_placement
from e2e.tests.kube import apply, create_namespace, get, pdd, pod, simulated_example, wait_for, wait_pdd_ready

NAME = "dra"
DRA_POOL = "dra"  # a node of its own, whose GPUs come from the DRA driver only
PCI = [pci_address(Gpu(i)) for i in range(8)]
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def dra_node(stack: Stack) -> Iterator[NodeLayout]:
    """A pool of one node (tainted: no other module's pod lands there) running the DRA driver and no device
    plugin, torn down after this module's tests."""
    cp = stack.cp
    plugins = {"dra": dra_driver.real_node_plugin(dra_driver.install(cp))}
    (node,) = stack.start_real_pool(DRA_POOL, 1, plugins)
    yield NodeLayout.from_dict(cp.extras["real_nodes"][node]["layout"])
    stack.remove_real_node(node)


@pytest.fixture(scope="module")
def deployed(operator: Stack, dra_node: NodeLayout) -> Iterator[str]:
    cp = operator.cp
    values = {"rbac.dynamicResourceAllocation": "true"}  # opt-in DRA rights
    operator.install_operator(values=values)
    namespace = "pd-dra"
    create_namespace(cp, namespace)
    apply(cp, json.dumps(deployment()), namespace)
    wait_pdd_ready(cp, namespace, NAME, timeout_s=180)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    operator.install_operator()  # the suite's default grants again


def deployment() -> Obj:
    """The simulated write example on the DRA node, its 8 GPUs requested through a ResourceClaim."""
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    obj["spec"]["simulation"]["reserveGpus"] = True  # request GPUs as engine vllm would: here through DRA
    obj["spec"]["gpuAllocation"] = {"strategy": "dra", "dra": {"pciAddresses": PCI}}
    obj["spec"]["node"] = pool_placement(DRA_POOL)
    return obj


def _templates(cp: ControlPlane, namespace: str) -> list[str]:
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    listing = get(cp, f"{path}?labelSelector=pd.serving.dev/deployment={NAME}") or {}
    return sorted(t["metadata"]["name"] for t in listing.get("items", []))


def _allocated(gpus: range) -> str:
    return ",".join(device_name(Gpu(i)) for i in gpus)


def _assignment(cp: ControlPlane, namespace: str) -> Obj:
    obj = pdd(cp, namespace, NAME)
    assert obj is not None
    found: Obj = obj["status"]["gpuAssignment"]
    return found


def _claim(cp: ControlPlane, namespace: str, name: str) -> Obj:
    found = get(cp, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
    assert found is not None, f"no ResourceClaim {name}"
    return found


def _calls(layout: NodeLayout, op: str, claim_uid: str) -> list[Obj]:
    """The driver's answers to the kubelet's `op` (prepare, unprepare) for one claim."""
    return [e for e in dra_driver.events(layout) if e["op"] == op and e["claim"] == claim_uid]


def _device_health(cp: ControlPlane, namespace: str) -> dict[str, str]:
    """What the kubelet says of the devices of the serving pod's containers (the driver's health stream):
    resource ID (driver/pool/device) -> health."""
    serving = pod(cp, namespace, (pdd(cp, namespace, NAME) or {})["status"]["podName"]) or {}
    statuses = serving.get("status", {}).get("containerStatuses", [])
    allocated = [a for s in statuses for a in s.get("allocatedResourcesStatus") or []]
    return {r["resourceID"]: r["health"] for a in allocated for r in a["resources"]}


def _prepared_by_the_kubelet(cp: ControlPlane, layout: NodeLayout, namespace: str, claim: Obj) -> None:
    """The serving pod runs on the DRA node in containerd containers, and the node's kubelet had the driver
    prepare its claim, with exactly the claim's allocated devices, before that, and shows their health."""
    serving = pod(cp, namespace, (pdd(cp, namespace, NAME) or {})["status"]["podName"])
    assert serving is not None and serving["spec"]["nodeName"] == layout.name
    assert serving["status"]["phase"] == "Running"
    ids = [str(s.get("containerID", "")) for s in serving["status"]["containerStatuses"]]
    assert ids and all(i.startswith("containerd://") for i in ids), ids
    allocated = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER]
    *_, prepared = _calls(layout, "prepare", claim["metadata"]["uid"])  # the last call, which let the pod start
    assert prepared["devices"] == allocated and not prepared.get("error"), prepared
    assert prepared["namespace"] == namespace and prepared["name"] == claim["metadata"]["name"]
    healthy = {f"{DRIVER}/{layout.name}/{device}": "Healthy" for device in allocated}
    wait_for(lambda: _device_health(cp, namespace) == healthy, 30, f"the pod's devices Healthy: {healthy}")


def test_the_kubelet_registers_the_driver_which_publishes_the_nodes_gpus(
    cp: ControlPlane, dra_node: NodeLayout
) -> None:
    def registered() -> list[Obj]:
        return [e for e in dra_driver.events(dra_node) if e["op"] == "registered"]

    (answer,) = wait_for(registered, 30, "the kubelet's answer to the driver's registration")
    assert not answer.get("error"), answer
    selector = f"spec.nodeName={dra_node.name},spec.driver={DRIVER}"

    def published() -> list[Obj] | None:
        listing = get(cp, f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}") or {}
        return listing.get("items") or None

    (found,) = wait_for(published, 60, f"the ResourceSlice of {dra_node.name}")
    assert found["spec"]["pool"]["name"] == dra_node.name
    assert found["metadata"]["ownerReferences"][0]["name"] == dra_node.name
    want = {d["name"]: d["attributes"] for d in devices(8)}
    assert {d["name"]: d["attributes"] for d in found["spec"]["devices"]} == want


def test_the_scheduler_allocates_the_pinned_gpus_and_the_kubelet_has_the_driver_prepare_them(
    cp: ControlPlane, dra_node: NodeLayout, deployed: str
) -> None:
    def allocated() -> Obj | None:
        found = _assignment(cp, deployed)
        return found if found.get("allocated") else None

    found = wait_for(allocated, 60, "the ResourceClaim's allocation in status")
    assert found["strategy"] == "dra" and found["claim"]
    assert found["prefill"] == _allocated(range(0, 4)) and found["decode"] == _allocated(range(4, 8))
    claim = _claim(cp, deployed, found["claim"])
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(d["request"], d["device"]) for d in found["allocated"]] == [(r["request"], r["device"]) for r in results]
    assert {r["pool"] for r in results} == {dra_node.name}
    _prepared_by_the_kubelet(cp, dra_node, deployed, claim)


def test_a_changed_template_is_rolled_under_a_new_name_and_the_old_claim_unprepared(
    cp: ControlPlane, dra_node: NodeLayout, deployed: str
) -> None:
    (before,) = _templates(cp, deployed)
    old_claim = _claim(cp, deployed, _assignment(cp, deployed)["claim"])
    pod_before = pdd(cp, deployed, NAME)["status"]["podUid"]  # type: ignore[index]
    patch = {"spec": {"prefill": {"gpus": "4-7"}, "decode": {"gpus": "0-3"}}}  # swap the quads
    cp.kubectl("patch", "pdd", NAME, "-n", deployed, "--type=merge", "-p", json.dumps(patch))
    obj = wait_pdd_ready(cp, deployed, NAME, timeout_s=180)
    assert obj["status"]["podUid"] != pod_before, "the pod was rolled onto the new template"
    serving = get(cp, f"/api/v1/namespaces/{deployed}/pods/{obj['status']['podName']}")
    assert serving is not None
    (claim_ref,) = serving["spec"]["resourceClaims"]
    assert claim_ref["resourceClaimTemplateName"] != before
    wait_for(lambda: _templates(cp, deployed) == [claim_ref["resourceClaimTemplateName"]], 60, "the old template gone")

    def swapped() -> Obj | None:
        found = _assignment(cp, deployed)
        return found if found.get("prefill") == _allocated(range(4, 8)) else None

    found = wait_for(swapped, 60, "the new allocation in status")
    assert found["decode"] == _allocated(range(0, 4))
    old_uid = old_claim["metadata"]["uid"]
    (unprepared,) = wait_for(lambda: _calls(dra_node, "unprepare", old_uid), 60, "the old claim unprepared")
    *_, prepared = _calls(dra_node, "prepare", old_uid)
    assert unprepared["devices"] == prepared["devices"]
    _prepared_by_the_kubelet(cp, dra_node, deployed, _claim(cp, deployed, found["claim"]))
