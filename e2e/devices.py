"""The emulated node's devices and its device plugins: what each container sees in /dev and /sys/class.

A real MI300X node exposes its GPUs through the AMD GPU device plugin (`amd.com/gpu`), whose `Allocate`
mounts /dev/kfd plus the allocated GPUs' /dev/dri card and renderD nodes, nothing else; the kubelet's
device manager gives the containers of a pod disjoint GPUs. RDMA NICs come from their own plugins: the
Mellanox shared-device plugin (`rdma/hca_shared_devices_a`, every selected HCA shared by any number of
containers) or the AMD network operator (`amd.com/nic`, one NIC per unit). Their containers get
/dev/infiniband (rdma_cm, uverbs*, umad*); the KFD topology and the RDMA class in sysfs show what the
container may use. Privileged containers see every device of the node (amd-gpu-pod.md §1.1, §2.5).

Here the node's "host" is a directory (`NodeDevices.root`): its dev/ holds empty regular files standing
for the device nodes, its sys/class/ the sysfs entries the engine launcher's preflight reads. Containers
get bind mounts of those files at the real paths (see sandbox.py and container_init.py), so the
launcher runs unmodified against real paths. Allocation is pure (`DeviceManager`), tested without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

GPU_RESOURCE = "amd.com/gpu"
SHARED_RDMA_RESOURCE = "rdma/hca_shared_devices_a"
NIC_RESOURCE = "amd.com/nic"
SHARED_RDMA_CAPACITY = 1000  # the shared-device plugin's rdmaHcaMax default
# sysfs classes a container sees only through this emulation (the machine's own stay hidden)
EMULATED_SYS_CLASSES = ("drm", "kfd", "infiniband", "infiniband_verbs")
KFD_NODES = "kfd/kfd/topology/nodes"
CPU_SOCKETS = 2
MI300X_SIMD_COUNT = 1216


D = TypeVar("D", "Gpu", "Nic")


class AllocationError(Exception):
    """The kubelet could not admit the pod: its devices are not available (UnexpectedAdmissionError)."""


@dataclass(frozen=True)
class Gpu:
    index: int

    @property
    def card(self) -> str:
        return f"card{self.index + 1}"  # card0 is usually the BMC's display adapter

    @property
    def render(self) -> str:
        return f"renderD{128 + self.index}"

    @property
    def kfd_node(self) -> int:
        return CPU_SOCKETS + self.index  # KFD lists the CPU sockets first


@dataclass(frozen=True)
class Nic:
    index: int

    @property
    def name(self) -> str:
        return f"ionic_{self.index}"  # AMD Pollara 400 (AINIC), the MI300X platform's RoCE NIC

    @property
    def uverbs(self) -> str:
        return f"uverbs{self.index}"

    @property
    def umad(self) -> str:
        return f"umad{self.index}"


@dataclass(frozen=True)
class NodeDevices:
    """What the node has; `uverbs_loaded=False` is a node whose ib_uverbs module is not loaded: the NICs
    show in sysfs and the RDMA plugins still advertise their resources, but no uverbs node exists."""

    root: Path
    gpus: int = 8
    nics: int = 8
    uverbs_loaded: bool = True

    def capacity(self) -> dict[str, str]:
        out = {GPU_RESOURCE: str(self.gpus)}
        if self.nics:
            out |= {SHARED_RDMA_RESOURCE: str(SHARED_RDMA_CAPACITY), NIC_RESOURCE: str(self.nics)}
        return out

    def all_gpus(self) -> tuple[Gpu, ...]:
        return tuple(Gpu(i) for i in range(self.gpus))

    def all_nics(self) -> tuple[Nic, ...]:
        return tuple(Nic(i) for i in range(self.nics))


@dataclass(frozen=True)
class Allocation:
    """The devices of one container: `nics` it sees, of which `owned_nics` are its alone (amd.com/nic)."""

    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    owned_nics: tuple[Nic, ...] = ()


@dataclass
class DeviceManager:
    """The kubelet device manager: devices per container, disjoint for exclusive resources, held until
    the pod ends. Lowest free GPUs first, which on MI300X gives each 4-GPU container a NUMA-local quad
    (the AMD plugin's preferred allocation)."""

    node: NodeDevices
    held: dict[str, dict[str, Allocation]] = field(default_factory=dict)  # pod uid -> container -> devices

    def allocate(self, pod_uid: str, requests: Mapping[str, Mapping[str, int]]) -> dict[str, Allocation]:
        """`requests`: container name -> {resource: count}; the same pod gets the same answer again."""
        if pod_uid in self.held:
            return self.held[pod_uid]
        busy_gpus = {g for pod in self.held.values() for a in pod.values() for g in a.gpus}
        busy_nics = {n for pod in self.held.values() for a in pod.values() for n in a.owned_nics}
        free_gpus = [g for g in self.node.all_gpus() if g not in busy_gpus]
        free_nics = [n for n in self.node.all_nics() if n not in busy_nics]
        result: dict[str, Allocation] = {}
        for container, wanted in requests.items():
            gpus = _take(free_gpus, wanted.get(GPU_RESOURCE, 0), GPU_RESOURCE)
            owned = tuple(_take(free_nics, wanted.get(NIC_RESOURCE, 0), NIC_RESOURCE))
            # the shared plugin mounts every HCA its selectors match, for any number of containers
            nics = self.node.all_nics() if wanted.get(SHARED_RDMA_RESOURCE, 0) > 0 else owned
            result[container] = Allocation(gpus=tuple(gpus), nics=nics, owned_nics=owned)
        self.held[pod_uid] = result
        return result

    def release(self, pod_uid: str) -> None:
        self.held.pop(pod_uid, None)


def _take(free: list[D], count: int, resource: str) -> list[D]:
    if count > len(free):
        raise AllocationError(
            f"Allocate failed due to requested number of devices unavailable for {resource}. "
            f"Requested: {count}, Available: {len(free)}, which is unexpected"
        )
    taken = free[:count]
    del free[:count]
    return taken


def device_requests(container: Mapping[str, object]) -> dict[str, int]:
    """The container's device-plugin resources (extended resources are set as limits; requests equal)."""
    resources = container.get("resources") or {}
    assert isinstance(resources, Mapping)
    limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    names = (GPU_RESOURCE, SHARED_RDMA_RESOURCE, NIC_RESOURCE)
    return {name: int(str(limits[name])) for name in names if name in limits}


# ---- what a container sees ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerView:
    """The container's device nodes (host file -> path in the container) and the devices sysfs shows."""

    devices: tuple[tuple[Path, str], ...]
    allocation: Allocation


def container_view(node: NodeDevices, allocation: Allocation, privileged: bool) -> ContainerView:
    """What the device plugins' Allocate answers mount (or, privileged, every device of the node)."""
    if privileged:
        allocation = Allocation(gpus=node.all_gpus(), nics=node.all_nics())
    paths: list[str] = []
    if allocation.gpus:
        paths.append("/dev/kfd")  # one per node, whatever the number of GPUs
        for gpu in allocation.gpus:
            paths += [f"/dev/dri/{gpu.card}", f"/dev/dri/{gpu.render}"]
    if allocation.nics:
        paths.append("/dev/infiniband/rdma_cm")
        for nic in allocation.nics:
            paths.append(f"/dev/infiniband/{nic.umad}")
            if node.uverbs_loaded:
                paths.append(f"/dev/infiniband/{nic.uverbs}")
    devices = tuple((node.root / path.lstrip("/"), path) for path in paths)
    return ContainerView(devices=devices, allocation=allocation)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_sys_class(target: Path, node: NodeDevices, visible: Allocation) -> None:
    """sysfs classes as a container with `visible` devices reads them: the KFD topology lists every node
    but only the container's GPUs can be read (the device cgroup answers EPERM for the others; here their
    properties file is absent), drm and the RDMA classes show only what was allocated."""
    for name in EMULATED_SYS_CLASSES:
        (target / name).mkdir(parents=True, exist_ok=True)
    nodes = target / KFD_NODES
    for socket in range(CPU_SOCKETS):
        _write(nodes / str(socket) / "properties", f"cpu_cores_count 96\nsimd_count 0\nnode_id {socket}\n")
    for gpu in node.all_gpus():
        (nodes / str(gpu.kfd_node)).mkdir(parents=True, exist_ok=True)
        if gpu in visible.gpus:
            properties = f"cpu_cores_count 0\nsimd_count {MI300X_SIMD_COUNT}\nnode_id {gpu.kfd_node}\n"
            _write(nodes / str(gpu.kfd_node) / "properties", properties + f"drm_render_minor {128 + gpu.index}\n")
    for gpu in visible.gpus:
        for entry in (gpu.card, gpu.render):
            _write(target / "drm" / entry / "device" / "current_compute_partition", "SPX\n")
            _write(target / "drm" / entry / "device" / "current_memory_partition", "NPS1\n")
    for nic in visible.nics:
        _write(target / "infiniband" / nic.name / "ports" / "1" / "state", "4: ACTIVE\n")
        _write(target / "infiniband" / nic.name / "ports" / "1" / "link_layer", "Ethernet\n")
        if node.uverbs_loaded:
            _write(target / "infiniband_verbs" / nic.uverbs / "ibdev", f"{nic.name}\n")


def create_node_root(node: NodeDevices) -> None:
    """The node's device files and full sysfs view (what hostPath volumes of /dev or /sys name)."""
    everything = Allocation(gpus=node.all_gpus(), nics=node.all_nics())
    for host_file, _ in container_view(node, everything, privileged=True).devices:
        host_file.parent.mkdir(parents=True, exist_ok=True)
        host_file.touch()
    write_sys_class(node.root / "sys" / "class", node, everything)
