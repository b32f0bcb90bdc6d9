"""Engine preflight: pure checks of what a container sees against what its engine needs.

A vLLM engine that starts on the wrong GPUs, without RDMA or with a 64 MiB /dev/shm fails minutes later
with an error far from the cause (or silently runs slower). These checks turn the usual causes into one
clear sentence each, before the engine starts. They are pure functions over `HostFacts` (gathered by
`pd_runtime.hostfacts`), so every rule is tested without a GPU.

GPU counts come from the device nodes, the visible-devices variables and the KFD topology, never from
amd-smi/rocm-smi: those can list GPUs the container's device cgroup hides (with N/A fields).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pd_runtime.vllm_releases import same_release

Role = Literal["prefill", "decode", "engine"]
Backend = Literal["rdma", "xgmi", "none"]

# vLLM on ROCm reads CUDA_VISIBLE_DEVICES and copies it to HIP_VISIBLE_DEVICES (it raises if both are
# set and differ); ROCR_VISIBLE_DEVICES filters first, and HIP numbers index what ROCr leaves visible.
ROCR_VAR = "ROCR_VISIBLE_DEVICES"
HIP_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
VISIBLE_DEVICE_VARS = (ROCR_VAR, *HIP_VARS)
# TP=N on whole MI300X GPUs needs the default partition modes (amd-gpu-pod.md §1.4).
EXPECTED_COMPUTE_PARTITION = "SPX"
EXPECTED_MEMORY_PARTITION = "NPS1"
# With tensor parallelism vLLM's workers exchange data through /dev/shm; Docker's 64 MiB default is too
# small. Used when --min-shm-mib is not given and the engine spans more than one GPU.
DEFAULT_MIN_SHM_MIB_MULTI_GPU = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class EngineNeeds:
    """What the engine about to start needs, from the launcher's flags."""

    role: Role
    gpus: int
    backend: Backend
    ports: tuple[int, ...] = ()
    min_shm_mib: int = 0
    vllm_version: str | None = None  # the release the spec declares (engineVersion); None: not checked


@dataclass(frozen=True)
class GpuPartition:
    render_node: str
    compute: str | None
    memory: str | None


@dataclass(frozen=True)
class HostFacts:
    """What the container sees. None means "could not be read here", which no check treats as a failure."""

    kfd_present: bool = False
    render_nodes: tuple[str, ...] = ()
    visible_devices: Mapping[str, str] = field(default_factory=dict)
    kfd_gpu_nodes: int | None = None
    partitions: tuple[GpuPartition, ...] = ()
    shm_bytes: int | None = None
    rdma_devices: tuple[str, ...] = ()
    uverbs_nodes: tuple[str, ...] = ()
    busy_ports: Mapping[int, str] = field(default_factory=dict)
    engine_version: str | None = None  # the vLLM release the engine command runs
    engine_version_source: str = ""  # where that was read


def effective_min_shm_mib(gpus: int, requested: int | None) -> int:
    if requested is not None:
        return requested
    return DEFAULT_MIN_SHM_MIB_MULTI_GPU if gpus > 1 else 0


def _device_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _hip_list_problem(name: str, entries: list[str], available: int) -> str | None:
    """HIP/CUDA entries must be indices 0..available-1: containers renumber their GPUs from 0."""
    for entry in entries:
        if not entry.isdigit() or int(entry) >= available:
            return (
                f"{name}={','.join(entries)} names GPU {entry!r}, but this container sees only {available} "
                f"GPU(s), numbered 0..{available - 1}: GPUs given by the device plugin or DRA are renumbered "
                f"from 0, so physical ids such as 4-7 are invalid here; leave {name} unset or use 0..N-1"
            )
    if len(set(entries)) != len(entries):
        return f"{name}={','.join(entries)} lists a GPU twice"
    return None


def visible_gpu_count(facts: HostFacts) -> tuple[int, list[str]]:
    """How many GPUs the engine will use, and any problems with the visible-devices variables."""
    env = facts.visible_devices
    available = len(facts.render_nodes)
    if ROCR_VAR in env:
        # ROCR also accepts GPU UUIDs; only numeric entries can be checked against the render nodes.
        rocr = _device_list(env[ROCR_VAR])
        numeric = [entry for entry in rocr if entry.isdigit()]
        problem = _hip_list_problem(ROCR_VAR, numeric, available) if numeric == rocr else None
        if problem:
            return available, [problem]
        available = len(rocr)
    hip_values = {name: env[name] for name in HIP_VARS if name in env}
    if not hip_values:
        return available, []
    if len(set(hip_values.values())) > 1:
        shown = ", ".join(f"{name}={value}" for name, value in hip_values.items())
        return available, [f"{shown} differ; vLLM refuses to start when both are set to different values"]
    name, value = next(iter(hip_values.items()))
    entries = _device_list(value)
    problem = _hip_list_problem(name, entries, available)
    return len(entries), [problem] if problem else []


def check_gpus(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    if needs.gpus == 0:
        return []
    if not facts.kfd_present:
        return [
            "/dev/kfd is missing: the container has no AMD GPU access (request amd.com/gpu in the "
            "container's resources.limits, or mount /dev/kfd and /dev/dri for the hostDevices strategy)"
        ]
    if not facts.render_nodes:
        return ["no /dev/dri/renderD* device in the container: no GPU was assigned to it"]
    visible, problems = visible_gpu_count(facts)
    if not problems and visible != needs.gpus:
        source = ", ".join(f"{k}={v}" for k, v in facts.visible_devices.items()) or (
            f"{len(facts.render_nodes)} /dev/dri/renderD* node(s)"
        )
        problems.append(
            f"the {needs.role} engine needs {needs.gpus} GPU(s) but {visible} are visible ({source}); "
            f"the GPU range of the role and the container's GPU resources must agree"
        )
    if facts.kfd_gpu_nodes is not None and facts.kfd_gpu_nodes < needs.gpus:
        problems.append(
            f"the KFD topology (/sys/class/kfd) shows only {facts.kfd_gpu_nodes} GPU(s) this container may "
            f"use, {needs.gpus} needed: the device cgroup hides the rest"
        )
    return problems


def check_partitions(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    if needs.gpus == 0:
        return []
    wrong = [
        f"{part.render_node}: {part.compute or '?'}/{part.memory or '?'}"
        for part in facts.partitions
        if (part.compute and part.compute.upper() != EXPECTED_COMPUTE_PARTITION)
        or (part.memory and part.memory.upper() != EXPECTED_MEMORY_PARTITION)
    ]
    if not wrong:
        return []
    return [
        f"GPU partition mode is not {EXPECTED_COMPUTE_PARTITION}/{EXPECTED_MEMORY_PARTITION} "
        f"({'; '.join(wrong)}): tensor parallelism over whole MI300X GPUs needs the default mode; "
        f"repartition the node (AMD GPU Operator's Device Config Manager) or pick another node"
    ]


def check_shm(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    if needs.min_shm_mib <= 0:
        return []
    if facts.shm_bytes is None:
        return [f"/dev/shm is missing; the engine needs at least {needs.min_shm_mib} MiB of shared memory"]
    have_mib = facts.shm_bytes // MIB
    if have_mib >= needs.min_shm_mib:
        return []
    return [
        f"/dev/shm is {have_mib} MiB, the {needs.role} engine needs at least {needs.min_shm_mib} MiB: mount "
        f"an emptyDir with medium Memory and a sizeLimit at /dev/shm"
    ]


def check_rdma(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    if needs.backend != "rdma":
        return []
    problems = []
    if not facts.rdma_devices:
        problems.append(
            "backend rdma, but /sys/class/infiniband lists no RDMA device: MoRI-IO moves the KV cache "
            "through an RDMA NIC even on one node; use a node with an RDMA NIC and its kernel driver loaded"
        )
    if not facts.uverbs_nodes:
        problems.append(
            "backend rdma, but the container has no /dev/infiniband/uverbs* device: request the RDMA "
            "device-plugin resource (e.g. rdma/hca_shared_devices_a: 1) or mount /dev/infiniband; if the "
            "container requests it, the node has no uverbs device for the plugin to mount (ib_uverbs not "
            "loaded, or the plugin's selectors match no NIC)"
        )
    return problems


def check_ports(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    problems = []
    duplicates = sorted({port for port in needs.ports if needs.ports.count(port) > 1})
    if duplicates:
        problems.append(f"--ports lists {', '.join(map(str, duplicates))} more than once")
    for port in sorted(set(needs.ports)):
        if port in facts.busy_ports:
            problems.append(
                f"port {port} is already in use ({facts.busy_ports[port]}): another process in the pod "
                f"(or on the node, with hostNetwork) listens there; give each role distinct ports"
            )
    return problems


def check_engine_version(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    """The engine must run the release the spec declares: the operator rendered that release's flags and
    kv-transfer keys (which another release may refuse or read otherwise) and admitted what its connector
    supports."""
    declared, installed = needs.vllm_version, facts.engine_version
    if declared is None or installed is None:
        return []
    try:
        if same_release(declared, installed):
            return []
    except ValueError:
        pass
    return [
        f"the spec declares vLLM {declared} (spec.engineVersion, or the default image's when unset) but this "
        f"container runs vLLM {installed} ({facts.engine_version_source}): set spec.engineVersion to "
        f"{installed}, or use an image of vLLM {declared}"
    ]


CHECKS: tuple[Callable[[EngineNeeds, HostFacts], list[str]], ...] = (
    check_gpus,
    check_partitions,
    check_shm,
    check_rdma,
    check_ports,
    check_engine_version,
)


def preflight(needs: EngineNeeds, facts: HostFacts) -> list[str]:
    """Every problem that would keep this engine from starting correctly; empty when it may start."""
    return [problem for check in CHECKS for problem in check(needs, facts)]


def failure_message(needs: EngineNeeds, problems: list[str], limit: int = 4096) -> str:
    """The termination message: the kubelet keeps at most 4096 bytes, so long lists are cut."""
    text = f"pdctl engine: preflight failed for the {needs.role} engine:\n" + "".join(
        f"- {problem}\n" for problem in problems
    )
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 4].decode(errors="ignore") + "...\n"
