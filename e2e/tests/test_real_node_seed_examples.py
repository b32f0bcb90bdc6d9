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
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
import yaml

from e2e import device_plugins, real_node
from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.node_config import MI300X_SERVER
from e2e.stack import Stack
from e2e.tests.kube import Obj, create_namespace, is_true, pdd, pod, wait_for, wait_pdd_ready

pytestmark = pytest.mark.real_node  # runs on the real cluster (e2e/tests/conftest.py)

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


@pytest.fixture(scope="module")
def seed_node(real_stack: Stack) -> Iterator[str]:
    """The fake MI300X node, torn down after this module's tests."""
    cp = real_stack.cp
    manifest = real_node.ImageManifest.load()
    images = [*manifest.node_images(("pause",)), manifest.image_as("runtime-rocm-standin", manifest.role("runtime"))]
    devices = {"devices": device_plugins.real_node_plugin()}
    real_stack.start_real_node(SEED_NODE, images, GPU_PRODUCT, (), devices, MI300X_SERVER)
    capacity = json.loads(cp.kubectl("get", "node", SEED_NODE, "-o", "json"))["status"]["capacity"]
    assert (capacity["cpu"], capacity["memory"]) == (str(MI300X_SERVER.cpus), f"{MI300X_SERVER.memory_gib}Gi")
    yield SEED_NODE
    real_node.teardown(cp, cp.extras["real_nodes"][SEED_NODE])
    cp.kubectl("delete", "node", SEED_NODE, "--wait=false", check=False)


@pytest.fixture
def seed_namespace(real_stack: Stack) -> Iterator[str]:
    """A namespace where the examples' host-network pods are allowed (Pod Security privileged), holding
    the `models` claim bound to a PersistentVolume of its own on a directory of the node."""
    cp = real_stack.cp
    name = create_namespace(cp, f"seed-{secrets.token_hex(3)}", "privileged")
    volume = f"models-{name}"
    for manifest in _models_volume(name, volume):
        cp.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
    yield name
    # no wait: the next example's pod is scheduled once this one is gone and its GPUs are free again
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cp.kubectl("delete", "persistentvolume", volume, "--wait=false", check=False)


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


def _kv_verified(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    found = pdd(cp, namespace, name)
    return found if is_true(found, "KVTransferVerified") else None


def _render_nodes(cp: ControlPlane, namespace: str, pod_name: str, container: str) -> set[int]:
    """The GPUs the kubelet put into `container`, by their render nodes' index."""
    listing = cp.kubectl("exec", "-n", namespace, pod_name, "-c", container, "--", "ls", "/dev/dri")
    return {int(entry[len("renderD") :]) - RENDER_MINOR for entry in listing.split() if entry.startswith("renderD")}


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_seed_example_applied_unchanged_is_ready_on_a_node_with_fake_mi300x_devices(
    real_stack: Stack, seed_node: str, seed_namespace: str, example: str
) -> None:
    cp, namespace = real_stack.cp, seed_namespace
    path = REPO_ROOT / "examples" / f"{example}.yaml"
    written = path.read_bytes()
    spec = yaml.safe_load(written)
    name = spec["metadata"]["name"]
    cp.kubectl("apply", "-n", namespace, "-f", str(path))
    assert _last_applied(cp, namespace, name) == spec  # the file as it is, nothing added or changed

    status = wait_pdd_ready(cp, namespace, name, timeout_s=150)["status"]
    if spec["spec"].get("mode", "disaggregated") == "disaggregated":
        wait_for(lambda: _kv_verified(cp, namespace, name), 90, "KVTransferVerified True")
    serving = pod(cp, namespace, status["podName"])
    assert serving is not None and serving["spec"]["nodeName"] == seed_node
    host_network = bool(spec["spec"].get("kvTransfer", {}).get("rdma", {}).get("hostNetwork"))
    assert serving["spec"].get("hostNetwork", False) == host_network
    assert (serving["status"]["podIP"] == serving["status"]["hostIP"]) == host_network
    assert status["gpuAssignment"]["strategy"] == "devicePlugin"
    got = {}
    for engine in EXAMPLES[example]:
        container = next(c for c in serving["spec"]["containers"] if c["name"] == engine)
        limits = container["resources"]["limits"]
        got[engine] = _render_nodes(cp, namespace, status["podName"], engine)
        assert len(got[engine]) == int(limits["amd.com/gpu"])
        if "rdma/hca_shared_devices_a" in limits:  # the RDMA plugin's devices
            verbs = cp.kubectl("exec", "-n", namespace, status["podName"], "-c", engine, "--", "ls", "/dev/infiniband")
            assert "uverbs0" in verbs.split()
        log = cp.kubectl("logs", "-n", namespace, status["podName"], "-c", engine)
        assert f"preflight passed for the {engine.split('-')[0]} engine" in log, log[-2000:]
    # the plugin's preferred NUMA-local runs, in container order, are the example's own ranges
    assert got == {engine: set(gpus) for engine, gpus in EXAMPLES[example].items()}
    ids = [str(s.get("containerID", "")) for s in serving["status"]["containerStatuses"]]
    assert len(ids) == len(serving["spec"]["containers"]) and all(i.startswith("containerd://") for i in ids)
    assert path.read_bytes() == written
