"""The seed's examples, applied unchanged, become Ready on a real node with fake MI300X devices.

A node of its own, `mi300x-seed`, is what an 8x MI300X server looks like to Kubernetes: its kubelet sees
the server's host CPUs and memory (node_config.MI300X_SERVER; each engine asks for 16 CPUs and 96Gi), the
fake device plugins give it 8 `amd.com/gpu`, `rdma/hca_shared_devices_a` and `amd.com/nic` through the
kubelet's device-plugin API, and it carries the label the examples select (`amd.com/gpu.product-name`,
set by the AMD GPU operator's node labeller on a real cluster). Its containerd holds the runtime image
built from `Dockerfile.rocm` on the ROCm stand-in base (docs/images.md), whose `vllm serve` runs the
simulated engine, under the name the examples use: the engines run `pdctl engine`, its preflight over the
devices the kubelet put in the container, then `vllm serve` with the example's own arguments. Only this
test node gets that image under that name.

The examples keep the weights on a PersistentVolumeClaim `models`, which the test provides as an
administrator would (a PersistentVolume on a directory of the node) before applying the file itself.

A second such node, `mi300x-no-uverbs`, is misconfigured: ib_uverbs is not loaded, its RDMA plugin still
advertises `rdma/hca_shared_devices_a` but hands out no /dev/infiniband/uverbs* (the fake plugins'
`-no-uverbs`). A variant of the read example placed there shows what a refused preflight looks like to
the user: its reason in a condition, an Event and the phase.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from e2e import device_plugins, real_node
from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.device_plugins import NodeDevicesSpec
from e2e.node_config import MI300X_SERVER
from e2e.stack import MISCONFIGURED_TAINT, Stack
from e2e.tests.kube import (
    Obj,
    condition,
    create_namespace,
    is_true,
    pdd,
    pdd_events,
    pod,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)
from e2e.tests.rogue import check_rogue_gets_nothing

SEED_NODE = "mi300x-seed"
GPU_PRODUCT = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
RENDER_MINOR = 128  # the fake GPU i is /dev/dri/renderD(128+i), as on a real node (e2e/tools/devplugins)
# Each example's engine containers and the GPUs each declares (`gpus`), which the plugin's picks must match.
# Not qwen3-235b-2p1d: it declares vLLM 0.34.0, which the test image is not (docs/e2e-real-node.md).
EXAMPLES = {
    "qwen3-235b-colocated": {"engine-0": range(0, 4), "engine-1": range(4, 8)},
    "qwen3-235b-read": {"prefill": range(0, 4), "decode": range(4, 8)},
    "qwen3-235b-write": {"prefill": range(0, 4), "decode": range(4, 8)},
}
SERVING_CONDITIONS = {  # by the example's mode: each True once it serves
    "disaggregated": ["PrefillReady", "DecodeReady", "ProxyReady", "Ready", "KVTransferVerified"],
    "colocated": ["EngineReady", "ProxyReady", "Ready"],
}
MISCONFIGURED_NODE = "mi300x-no-uverbs"
REFUSED = "no-uverbs"  # the read example's variant placed on MISCONFIGURED_NODE
RDMA = "rdma/hca_shared_devices_a"


def _start_mi300x_node(stack: Stack, name: str, devices: NodeDevicesSpec, taints: tuple[str, ...]) -> None:
    """A fake MI300X node: the server's shape, the GPU product label, the fake device plugins, the pause
    image and the ROCm stand-in under the runtime's name."""
    manifest = real_node.ImageManifest.load()
    images = [*manifest.node_images(("pause",)), manifest.image_as("runtime-rocm-standin", manifest.role("runtime"))]
    plugins = {"devices": device_plugins.real_node_plugin(devices)}
    stack.start_real_node(name, images, GPU_PRODUCT, taints, plugins, MI300X_SERVER)
    # The node is Ready before the kubelet has its plugins' resources (they register after it starts):
    # 1000 units advertised, whether or not the node has uverbs, seen by kubectl's watch
    stack.cp.kubectl("wait", f"node/{name}", f"--for=jsonpath={{.status.capacity.{RDMA}}}=1k", "--timeout=120s")
    capacity = json.loads(stack.cp.kubectl("get", "node", name, "-o", "json"))["status"]["capacity"]
    assert (capacity["cpu"], capacity["memory"]) == (str(MI300X_SERVER.cpus), f"{MI300X_SERVER.memory_gib}Gi")


@pytest.fixture(scope="module")
def seed_node(stack: Stack) -> Iterator[str]:
    """The fake MI300X node, torn down after this module's tests."""
    _start_mi300x_node(stack, SEED_NODE, NodeDevicesSpec(), ())
    yield SEED_NODE
    stack.remove_real_node(SEED_NODE)


def _models_namespace(cp: ControlPlane) -> tuple[str, str]:
    """A namespace where the examples' host-network pods are allowed (Pod Security privileged), holding
    the `models` claim bound to a PersistentVolume of its own on a directory of the node; returns the
    namespace and the volume."""
    name = create_namespace(cp, f"seed-{secrets.token_hex(3)}", "privileged")
    volume = f"models-{name}"
    for manifest in _models_volume(name, volume):
        cp.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
    return name, volume


def _delete_models_namespace(cp: ControlPlane, name: str, volume: str) -> None:
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cp.kubectl("delete", "persistentvolume", volume, "--wait=false", check=False)


@pytest.fixture(scope="module")
def refused_deployment(stack: Stack) -> Iterator[str]:
    """The misconfigured node, tainted so that only the read example's variant placed there lands on it;
    applied before the examples run, so that its refusal happens meanwhile. Yields its namespace."""
    cp = stack.cp
    devices = NodeDevicesSpec(uverbs=False)
    _start_mi300x_node(stack, MISCONFIGURED_NODE, devices, (f"{MISCONFIGURED_TAINT}=no-uverbs:NoSchedule",))
    namespace, volume = _models_namespace(cp)
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / "qwen3-235b-read.yaml").read_text())
    assert obj["spec"]["kvTransfer"]["rdma"]["resourceName"] == RDMA  # which the node advertises
    obj["metadata"]["name"] = REFUSED
    obj["spec"]["node"] = {
        "nodeSelector": {"kubernetes.io/hostname": MISCONFIGURED_NODE},
        "tolerations": [{"key": MISCONFIGURED_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    cp.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(obj))
    yield namespace
    cp.kubectl("delete", "pdd", REFUSED, "-n", namespace, "--wait=false", check=False)
    # while the node's kubelet still runs to finalize the pod
    wait_for(lambda: pod(cp, namespace, REFUSED) is None, 90, f"pod {namespace}/{REFUSED} gone")
    _delete_models_namespace(cp, namespace, volume)
    stack.remove_real_node(MISCONFIGURED_NODE)


@pytest.fixture
def seed_namespace(stack: Stack) -> Iterator[str]:
    """A namespace with the `models` claim (_models_namespace) for one example."""
    name, volume = _models_namespace(stack.cp)
    yield name
    # no wait: the next example's pod is scheduled once this one is gone and its GPUs are free again
    _delete_models_namespace(stack.cp, name, volume)


def _models_volume(namespace: str, volume: str) -> list[Obj]:
    """A claim `models` and the volume it binds to: a directory in the node's own /var/lib (its tmpfs)."""
    storage = {"storageClassName": "", "accessModes": ["ReadWriteOnce"]}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": storage
            | {
                "capacity": {"storage": "1Ti"},
                "hostPath": {"path": f"/var/lib/{volume}", "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": "models"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models", "namespace": namespace},
            "spec": storage | {"resources": {"requests": {"storage": "1Ti"}}, "volumeName": volume},
        },
    ]


def _last_applied(cp: ControlPlane, namespace: str, name: str) -> Obj:
    """What `kubectl apply` sent for the PDDeployment (its last-applied annotation), less what kubectl adds:
    the namespace and an empty annotations map."""
    found = pdd(cp, namespace, name) or {}
    applied: Obj = json.loads(found["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert applied["metadata"].pop("namespace") == namespace and applied["metadata"].pop("annotations") == {}
    return applied


def _engine_http_ports(serving: Obj) -> list[int]:
    """The engines' vLLM HTTP ports (named <prefix>-http) of the serving pod."""
    return [
        port["containerPort"]
        for c in serving["spec"]["containers"]
        if c["name"] != "proxy"
        for port in c.get("ports", [])
        if port["name"].endswith("-http")
    ]


def _condition_true(cp: ControlPlane, namespace: str, name: str, kind: str) -> bool:
    return is_true(pdd(cp, namespace, name), kind)


def _render_nodes(cp: ControlPlane, namespace: str, pod_name: str, container: str) -> set[int]:
    """The GPUs the kubelet put into `container`, by their render nodes' index."""
    listing = cp.kubectl("exec", "-n", namespace, pod_name, "-c", container, "--", "ls", "/dev/dri")
    return {int(entry[len("renderD") :]) - RENDER_MINOR for entry in listing.split() if entry.startswith("renderD")}


@pytest.mark.usefixtures("refused_deployment")
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_seed_example_applied_unchanged_is_ready_on_a_node_with_fake_mi300x_devices(
    stack: Stack, seed_node: str, seed_namespace: str, example: str, tmp_path: Path
) -> None:
    cp, namespace = stack.cp, seed_namespace
    path = REPO_ROOT / "examples" / f"{example}.yaml"
    written = path.read_bytes()
    spec = yaml.safe_load(written)
    name = spec["metadata"]["name"]
    cp.kubectl("apply", "-n", namespace, "-f", str(path))
    assert _last_applied(cp, namespace, name) == spec  # the file as it is, nothing added or changed

    status = wait_pdd_ready(cp, namespace, name, timeout_s=150)["status"]
    for kind in SERVING_CONDITIONS[spec["spec"].get("mode", "disaggregated")]:  # the canary's KV: up to 90 s
        wait_for(functools.partial(_condition_true, cp, namespace, name, kind), 90, f"{kind} True")
    serving = pod(cp, namespace, status["podName"])
    assert serving is not None and serving["spec"]["nodeName"] == seed_node
    address, api_port = serving["status"]["podIP"], spec["spec"].get("proxy", {}).get("port", 8000)
    assert stream_completion(address, api_port)
    host_network = bool(spec["spec"].get("kvTransfer", {}).get("rdma", {}).get("hostNetwork"))
    assert serving["spec"].get("hostNetwork", False) == host_network
    assert (address == serving["status"]["hostIP"]) == host_network
    if host_network:
        for port in _engine_http_ports(serving):  # on the node's loopback only (docs/security.md)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{address}:{port}/health", timeout=5, trust_env=False)
        # the proxy's loopback is the node's: a rogue process on the node gets no request either
        check_rogue_gets_nothing(stack, serving, tmp_path, api_port)
    assert status["gpuAssignment"]["strategy"] == "devicePlugin"
    got = {}
    for engine in EXAMPLES[example]:
        container = next(c for c in serving["spec"]["containers"] if c["name"] == engine)
        assert container["command"][:2] == ["pdctl", "engine"] and "vllm" in container["command"]
        limits = container["resources"]["limits"]
        got[engine] = _render_nodes(cp, namespace, status["podName"], engine)
        assert len(got[engine]) == int(limits["amd.com/gpu"])
        if RDMA in limits:  # the RDMA plugin's devices
            verbs = cp.kubectl("exec", "-n", namespace, status["podName"], "-c", engine, "--", "ls", "/dev/infiniband")
            assert "uverbs0" in verbs.split()
        log = cp.kubectl("logs", "-n", namespace, status["podName"], "-c", engine)
        assert f"preflight passed for the {engine.split('-')[0]} engine" in log, log[-2000:]
    # the plugin's preferred NUMA-local runs, in container order, are the example's own ranges
    assert got == {engine: set(gpus) for engine, gpus in EXAMPLES[example].items()}
    ids = [str(s.get("containerID", "")) for s in serving["status"]["containerStatuses"]]
    assert len(ids) == len(serving["spec"]["containers"]) and all(i.startswith("containerd://") for i in ids)
    assert path.read_bytes() == written


def test_refused_preflight_shows_in_status_and_events(stack: Stack, refused_deployment: str) -> None:
    cp, namespace, name = stack.cp, refused_deployment, REFUSED

    def refused() -> Obj | None:
        found = condition(pdd(cp, namespace, name), "PrefillReady") or {}
        return found if found.get("reason") == "PreflightFailed" else None

    prefill = wait_for(refused, 90, "PrefillReady reason PreflightFailed")
    assert prefill["status"] == "False"
    assert "preflight failed for the prefill engine" in prefill["message"]
    assert "no /dev/infiniband/uverbs* device" in prefill["message"], prefill["message"]
    assert (condition(pdd(cp, namespace, name), "DecodeReady") or {}).get("reason") == "PreflightFailed"
    events = wait_for(lambda: pdd_events(cp, namespace, name, "PreflightFailed"), 30, "a PreflightFailed Event")
    assert events[0]["type"] == "Warning" and "uverbs" in events[0]["message"]
    status = wait_for(lambda: _degraded(cp, namespace, name), 60, "phase Degraded")
    assert "uverbs" in status["message"]


def _degraded(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    status: Obj = (pdd(cp, namespace, name) or {}).get("status") or {}
    return status if status.get("phase") == "Degraded" else None
