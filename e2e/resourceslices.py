"""The emulated node's GPUs published for DRA, as the AMD GPU DRA driver's kubelet plugin does.

The driver (ROCm/k8s-gpu-dra-driver, ``cmd/gpu-kubeletplugin/deviceinfo.go``) publishes one
ResourceSlice per node for driver ``gpu.amd.com``, pool = the node's name, one device per whole GPU
named ``gpu-<cardIndex>-<renderIndex>`` with attributes ``type`` (amdgpu), ``productName``, ``numaNode``,
``deviceID``, ``partitionProfile``, ``driverVersion`` and the standard ``resource.kubernetes.io/pciBusID``
and ``resource.kubernetes.io/pcieRoot``, and capacities ``memory``, ``computeUnits``, ``simdUnits``. Its
Helm chart installs the DeviceClass ``gpu.amd.com`` (selector ``device.driver == 'gpu.amd.com'``). With
these the real kube-scheduler allocates ResourceClaims for the node's GPUs; the controller manager
creates each pod's claim from its template. The emulated node also keeps its device plugins (which a
GPU Operator makes exclusive with the DRA driver): each PDDeployment uses one or the other.
"""

from __future__ import annotations

from typing import Any

from e2e.devices import CPU_SOCKETS, MI300X_SIMD_COUNT, Gpu, NodeDevices
from e2e.kubeapi import ApiError, KubeClient

Obj = dict[str, Any]
DRIVER = "gpu.amd.com"
# MI300X OAM boards: the PCI bus of each GPU on a typical 8-GPU platform (e.g. the amd-gpu-pod.md sketch).
MI300X_BUSES = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)


def pci_address(gpu: Gpu) -> str:
    """Extended BDF (sysfs spelling) of an emulated GPU."""
    bus = MI300X_BUSES[gpu.index] if gpu.index < len(MI300X_BUSES) else 0x100 - len(MI300X_BUSES) + gpu.index
    return f"0000:{bus:02x}:00.0"


def device_name(gpu: Gpu) -> str:
    """The driver's canonical name, gpu-<card minor>-<render minor>."""
    return f"gpu-{gpu.card.removeprefix('card')}-{gpu.render.removeprefix('renderD')}"


def _device(gpu: Gpu, gpus: int) -> Obj:
    numa = gpu.index * CPU_SOCKETS // max(gpus, 1)
    return {
        "name": device_name(gpu),
        "attributes": {
            "type": {"string": "amdgpu"},
            "productName": {"string": "AMD_Instinct_MI300X_OAM"},
            "numaNode": {"int": numa},
            "deviceID": {"string": "0x74a1"},
            "partitionProfile": {"string": "spx_nps1"},
            "driverVersion": {"version": "6.12.12"},
            "resource.kubernetes.io/pciBusID": {"string": pci_address(gpu)},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{pci_address(gpu)[5:7]}"},
        },
        "capacity": {
            "memory": {"value": "192Gi"},
            "computeUnits": {"value": "304"},
            "simdUnits": {"value": str(MI300X_SIMD_COUNT)},
        },
    }


def resource_slice(node: str, node_uid: str, devices: NodeDevices) -> Obj:
    gpus = devices.all_gpus()
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{DRIVER}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(gpu, len(gpus)) for gpu in gpus],
        },
    }


def device_class() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }


async def publish(api: KubeClient, node: str, node_uid: str, devices: NodeDevices) -> None:
    """The DeviceClass (once per cluster, as the driver's chart) and this node's ResourceSlice, replaced."""
    try:
        await api.create("/apis/resource.k8s.io/v1/deviceclasses", device_class())
    except ApiError as err:
        if err.status != 409:
            raise
    body = resource_slice(node, node_uid, devices)
    path = "/apis/resource.k8s.io/v1/resourceslices"
    try:
        await api.create(path, body)
    except ApiError as err:
        if err.status != 409:
            raise
        await api.delete(f"{path}/{body['metadata']['name']}")  # a slice of an earlier run of this node
        await api.create(path, body)
