"""The emulated device plugins without a cluster: allocation rules, and the launcher's real preflight
reading a container's view of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from e2e import devices
from e2e.devices import Allocation, AllocationError, DeviceManager, NodeDevices
from pd_runtime import hostfacts
from pd_runtime.preflight import EngineNeeds, preflight

GPU, SHARED, NIC = devices.GPU_RESOURCE, devices.SHARED_RDMA_RESOURCE, devices.NIC_RESOURCE


def test_containers_of_a_pod_get_disjoint_gpus_numa_local_first(tmp_path: Path) -> None:
    manager = DeviceManager(NodeDevices(root=tmp_path))
    got = manager.allocate("pod-1", {"prefill": {GPU: 4, SHARED: 1}, "decode": {GPU: 4, SHARED: 1}, "proxy": {}})
    assert [g.index for g in got["prefill"].gpus] == [0, 1, 2, 3]
    assert [g.index for g in got["decode"].gpus] == [4, 5, 6, 7]
    assert got["prefill"].nics == got["decode"].nics == NodeDevices(root=tmp_path).all_nics(), "HCAs are shared"
    assert got["proxy"] == Allocation()
    assert manager.allocate("pod-1", {}) is got, "a pod keeps its devices across container restarts"


def test_exhausted_devices_refuse_the_pod_until_released(tmp_path: Path) -> None:
    manager = DeviceManager(NodeDevices(root=tmp_path, nics=2))
    manager.allocate("pod-1", {"a": {GPU: 8, NIC: 1}})
    with pytest.raises(AllocationError, match=re.escape("amd.com/gpu. Requested: 1, Available: 0")):
        manager.allocate("pod-2", {"b": {GPU: 1}})
    assert "pod-2" not in manager.held
    second = manager.allocate("pod-3", {"b": {NIC: 1}})["b"]
    assert [n.index for n in second.owned_nics] == [1], "amd.com/nic units are exclusive"
    with pytest.raises(AllocationError, match=re.escape("amd.com/nic")):
        manager.allocate("pod-4", {"c": {NIC: 1}})
    manager.release("pod-1")
    assert len(manager.allocate("pod-2", {"b": {GPU: 8}})["b"].gpus) == 8


def test_device_requests_read_extended_resources() -> None:
    container = {"resources": {"limits": {GPU: "4", SHARED: "1", "memory": "1Gi"}, "requests": {"cpu": "1"}}}
    assert devices.device_requests(container) == {GPU: 4, SHARED: 1}
    assert devices.device_requests({}) == {}


def test_views_mount_what_the_plugins_allocate(tmp_path: Path) -> None:
    node = NodeDevices(root=tmp_path, gpus=8, nics=2)
    gpus_only = devices.container_view(node, Allocation(gpus=(devices.Gpu(4),)), privileged=False)
    assert [path for _, path in gpus_only.devices] == ["/dev/kfd", "/dev/dri/card5", "/dev/dri/renderD132"]
    assert gpus_only.devices[0][0] == tmp_path / "dev/kfd"
    assert devices.container_view(node, Allocation(), privileged=False).devices == ()
    everything = [path for _, path in devices.container_view(node, Allocation(), privileged=True).devices]
    assert everything.count("/dev/kfd") == 1 and sum("renderD" in p for p in everything) == 8
    assert sum("uverbs" in p for p in everything) == 2
    broken = NodeDevices(root=tmp_path, nics=2, uverbs_loaded=False)
    paths = [p for _, p in devices.container_view(broken, Allocation(nics=broken.all_nics()), False).devices]
    assert paths == ["/dev/infiniband/rdma_cm", "/dev/infiniband/umad0", "/dev/infiniband/umad1"]


def container_root(tmp_path: Path, node: NodeDevices, allocation: Allocation) -> Path:
    """What the container's / looks like: its device files, its sysfs classes, a big enough /dev/shm."""
    devices.create_node_root(node)
    root = tmp_path / "container"
    for source, path in devices.container_view(node, allocation, privileged=False).devices:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev/shm").symlink_to("/dev/shm")  # only its size is read
    devices.write_sys_class(root / "sys/class", node, allocation)
    return root


@pytest.mark.parametrize("uverbs_loaded", [True, False])
def test_the_real_preflight_accepts_a_device_plugin_container_and_refuses_missing_uverbs(
    tmp_path: Path, uverbs_loaded: bool
) -> None:
    node = NodeDevices(root=tmp_path / "node", uverbs_loaded=uverbs_loaded)
    allocation = DeviceManager(node).allocate("pod", {"decode": {GPU: 4, SHARED: 1}})["decode"]
    facts = hostfacts.gather([], env={}, root=container_root(tmp_path, node, allocation))
    assert (facts.kfd_gpu_nodes, len(facts.render_nodes), len(facts.rdma_devices)) == (4, 4, 8)
    problems = preflight(EngineNeeds(role="decode", gpus=4, backend="rdma"), facts)
    if uverbs_loaded:
        assert problems == []
    else:
        assert len(problems) == 1 and "no /dev/infiniband/uverbs* device" in problems[0]
