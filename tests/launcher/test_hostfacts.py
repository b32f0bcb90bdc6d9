"""The gathering layer, on this machine (no GPU, no RDMA) and on a prepared device/sysfs tree."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from pd_runtime import hostfacts
from pd_runtime.preflight import GpuPartition

GPU_PROPERTIES = "cpu_cores_count 0\nsimd_count 1216\nnode_id 1\n"
CPU_PROPERTIES = "cpu_cores_count 96\nsimd_count 0\nnode_id 0\n"


def make_gpu_tree(root: Path, render_nodes: list[str], compute: str = "SPX", memory: str = "NPS1") -> None:
    (root / "dev/dri").mkdir(parents=True)
    (root / "dev/kfd").touch()
    (root / "dev/shm").mkdir()
    nodes = root / hostfacts.KFD_NODES
    for index, properties in enumerate([CPU_PROPERTIES] + [GPU_PROPERTIES] * len(render_nodes)):
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text(properties)
    for node in render_nodes:
        (root / "dev/dri" / node).touch()
        device = root / "sys/class/drm" / node / "device"
        device.mkdir(parents=True)
        (device / "current_compute_partition").write_text(compute + "\n")
        (device / "current_memory_partition").write_text(memory + "\n")
    (root / "dev/dri/card0").touch()


def test_this_machine_shows_no_gpu_and_a_real_shm() -> None:
    facts = hostfacts.gather([], env={})
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has an AMD GPU; the assertions below describe CPU-only CI machines")
    assert not facts.kfd_present
    assert facts.render_nodes == ()
    assert facts.shm_bytes is None or facts.shm_bytes > 0
    assert facts.visible_devices == {}


def test_prepared_tree_is_read_like_a_device_plugin_container(tmp_path: Path) -> None:
    make_gpu_tree(tmp_path, ["renderD128", "renderD136"], compute="CPX", memory="NPS4")
    env = {"HIP_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}
    facts = hostfacts.gather([], env=env, root=tmp_path)
    assert facts.kfd_present
    assert facts.render_nodes == ("renderD128", "renderD136")
    assert facts.kfd_gpu_nodes == 2
    assert facts.partitions == (GpuPartition("renderD128", "CPX", "NPS4"), GpuPartition("renderD136", "CPX", "NPS4"))
    assert facts.visible_devices == {"HIP_VISIBLE_DEVICES": "0,1"}
    assert facts.shm_bytes == os.statvfs(tmp_path / "dev/shm").f_blocks * os.statvfs(tmp_path / "dev/shm").f_frsize


def test_unreadable_kfd_properties_are_not_counted(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files regardless of their mode")
    make_gpu_tree(tmp_path, ["renderD128", "renderD136"])
    (tmp_path / hostfacts.KFD_NODES / "2" / "properties").chmod(0)
    assert hostfacts.kfd_gpu_nodes(tmp_path) == 1


def test_rdma_devices_and_uverbs_nodes_are_listed(tmp_path: Path) -> None:
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    for name in ("uverbs0", "rdma_cm"):
        (tmp_path / "dev/infiniband" / name).touch()
    facts = hostfacts.gather([], env={}, root=tmp_path)
    assert facts.rdma_devices == ("mlx5_0",)
    assert facts.uverbs_nodes == ("uverbs0",)
    assert facts.kfd_gpu_nodes is None


def test_a_listening_port_is_busy_and_a_free_one_is_not() -> None:
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        assert hostfacts.busy_ports([busy, free]) == {busy: errno.errorcode[errno.EADDRINUSE]}
