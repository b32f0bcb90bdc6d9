"""A node's GPUs as the AMD GPU DRA driver publishes them: the one source of what the fake driver publishes.

The driver (ROCm/k8s-gpu-dra-driver, ``cmd/gpu-kubeletplugin/deviceinfo.go``) publishes one
ResourceSlice per node for driver ``gpu.amd.com``, pool = the node's name, one device per whole GPU
named ``gpu-<cardIndex>-<renderIndex>`` with attributes ``type`` (amdgpu), ``productName``, ``numaNode``,
``deviceID``, ``partitionProfile``, ``driverVersion`` and the standard ``resource.kubernetes.io/pciBusID``
and ``resource.kubernetes.io/pcieRoot``, and capacities ``memory``, ``computeUnits``, ``simdUnits``. Its
Helm chart installs the DeviceClass ``gpu.amd.com`` (selector ``device.driver == 'gpu.amd.com'``). The
fake driver of a real node (e2e/dra_driver.py) publishes `devices` in its node's ResourceSlice; the real
kube-scheduler allocates ResourceClaims from it, and the node's kubelet has the driver prepare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
DRIVER = "gpu.amd.com"
CPU_SOCKETS = 2
MI300X_SIMD_COUNT = 1216
# MI300X OAM boards: the PCI bus of each GPU on a typical 8-GPU platform (e.g. the amd-gpu-pod.md sketch).
MI300X_BUSES = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node by its index: the minors of its DRM nodes, as the amdgpu driver numbers them."""

    index: int

    @property
    def card(self) -> str:
        return f"card{self.index + 1}"  # card0 is usually the BMC's display adapter

    @property
    def render(self) -> str:
        return f"renderD{128 + self.index}"


def pci_address(gpu: Gpu) -> str:
    """Extended BDF (sysfs spelling) of a fake GPU."""
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


def devices(gpus: int) -> list[Obj]:
    """The devices of a node with `gpus` MI300X GPUs, as resource.k8s.io/v1 Devices."""
    return [_device(Gpu(i), gpus) for i in range(gpus)]


def device_class() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }
