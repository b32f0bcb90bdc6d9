"""Gather what a container sees (devices, sysfs, /dev/shm, ports) into `HostFacts` for the preflight.

Thin on purpose: reading only, no decisions. Unreadable sources become None or empty, never errors; the
pure checks in `pd_runtime.preflight` decide what matters. `root` lets tests point at a prepared tree.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

from pd_runtime.preflight import VISIBLE_DEVICE_VARS, GpuPartition, HostFacts

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


def gather(ports: Iterable[int], env: Mapping[str, str], root: Path = Path("/")) -> HostFacts:
    render_nodes = _names(root / "dev/dri", "renderD")
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
    )
