"""Gather what a container sees (devices, sysfs, /dev/shm, ports) into `HostFacts` for the preflight.

Thin on purpose: reading only, no decisions. Unreadable sources become None or empty, never errors; the
pure checks in `pd_runtime.preflight` decide what matters. `root` lets tests point at a prepared tree.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pd_runtime.preflight import VISIBLE_DEVICE_VARS, GpuPartition, HostFacts
from pd_runtime.sim.versions import simulated_version

SIMULATOR = ("pdctl", "sim-engine")
# Run by the Python that runs `vllm`: the installed distribution's version, without importing vLLM (which
# would load torch and probe the GPUs). The runtime image keeps pdctl in a venv of its own, so the
# launcher's own Python cannot see vLLM.
_READ_VLLM_VERSION = "import importlib.metadata as m; print(m.version('vllm'))"
READ_VERSION_TIMEOUT_S = 60

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _names(directory: Path, prefix: str = "") -> tuple[str, ...]:
    try:
        return tuple(sorted(entry.name for entry in directory.iterdir() if entry.name.startswith(prefix)))
    except OSError:
        return ()


def kfd_gpu_nodes(root: Path) -> int | None:
    """GPU nodes whose KFD properties this process may read (the device cgroup hides the others)."""
    nodes = root / KFD_NODES
    if not nodes.is_dir():
        return None
    count = 0
    for node in _names(nodes):
        properties = _read(nodes / node / "properties") or ""
        fields = dict(line.split(maxsplit=1) for line in properties.splitlines() if " " in line)
        if fields.get("simd_count", "0").strip() != "0":
            count += 1
    return count


def partitions(root: Path, render_nodes: Iterable[str]) -> tuple[GpuPartition, ...]:
    found = []
    for node in render_nodes:
        device = root / "sys/class/drm" / node / "device"
        compute = _read(device / "current_compute_partition")
        memory = _read(device / "current_memory_partition")
        if compute or memory:
            found.append(GpuPartition(node, compute, memory))
    return tuple(found)


def shm_bytes(root: Path) -> int | None:
    try:
        stats = os.statvfs(root / "dev/shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def port_problem(port: int) -> str | None:
    """Why the engine could not listen on this port, or None if it can (bound the way servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as error:
            return errno.errorcode.get(error.errno or 0, str(error))
    return None


def busy_ports(ports: Iterable[int]) -> dict[int, str]:
    return {port: problem for port in ports if (problem := port_problem(port))}


def _python_of(executable: str, search: str | None) -> str | None:
    """The interpreter of ``executable`` when it is a Python script (its #! line), else python3 on PATH."""
    found = shutil.which(executable, path=search)
    line = ""
    if found is not None:
        with open(found, "rb") as script:
            line = script.readline(256).decode(errors="replace")
    words = line[2:].split() if line.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
    if words and "python" in os.path.basename(words[0]):
        return shutil.which(words[0], path=search)
    return shutil.which("python3", path=search)


def engine_version(command: Sequence[str], env: Mapping[str, str]) -> tuple[str | None, str]:
    """The vLLM release ``command`` runs and where that was read; None when it cannot be read."""
    if tuple(command[:2]) == SIMULATOR:
        return simulated_version(command[2:], env), "the simulated engine's --vllm-version or PD_SIM_VLLM_VERSION"
    python = _python_of(command[0], env.get("PATH")) if command else None
    if python is None:
        return None, "no Python interpreter for the engine command"
    source = f"the 'vllm' distribution's metadata in {python}"
    try:
        proc = subprocess.run(
            [python, "-c", _READ_VLLM_VERSION],
            capture_output=True,
            text=True,
            timeout=READ_VERSION_TIMEOUT_S,
            env=dict(env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, source
    version = proc.stdout.strip()
    return (version or None) if proc.returncode == 0 else None, source


def gather(
    ports: Iterable[int], env: Mapping[str, str], root: Path = Path("/"), command: Sequence[str] = ()
) -> HostFacts:
    render_nodes = _names(root / "dev/dri", "renderD")
    version, version_source = engine_version(command, env) if command else (None, "")
    return HostFacts(
        kfd_present=(root / "dev/kfd").exists(),
        render_nodes=render_nodes,
        visible_devices={name: env[name] for name in VISIBLE_DEVICE_VARS if name in env},
        kfd_gpu_nodes=kfd_gpu_nodes(root),
        partitions=partitions(root, render_nodes),
        shm_bytes=shm_bytes(root),
        rdma_devices=_names(root / "sys/class/infiniband"),
        uverbs_nodes=_names(root / "dev/infiniband", "uverbs"),
        busy_ports=busy_ports(ports),
        engine_version=version,
        engine_version_source=version_source,
    )
