"""e2e/kwok_config.py, what KWOK is given to play fake MI300X nodes (benchmarks/operator_scale.py runs it):
nodes an MI300X server's capacity and KWOK's annotation, pod addresses that refuse at once, stages that make
nodes and pods Ready, and the node count that holds a benchmark's pods."""

from __future__ import annotations

import ipaddress

import pytest
import yaml

from e2e import kwok_config
from e2e.node_config import MI300X_SERVER, MachineShape


def test_a_fake_node_has_the_server_shape_and_the_device_plugins_resources() -> None:
    node = kwok_config.fake_node(0, MI300X_SERVER)
    capacity = node["status"]["capacity"]
    assert capacity["cpu"] == "128" and capacity["memory"] == "1536Gi"
    assert capacity["amd.com/gpu"] == "8"
    assert capacity["rdma/hca_shared_devices_a"] == "1000" and capacity["amd.com/nic"] == "8"
    assert capacity["pods"] == "110"
    assert node["status"]["allocatable"] == capacity


def test_a_fake_node_is_kwoks_by_its_annotation_and_the_command_line_selects_it() -> None:
    node = kwok_config.fake_node(3, MI300X_SERVER)
    assert node["metadata"]["name"] == "kwok-mi300x-3"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-mi300x-3"
    ((key, value),) = node["metadata"]["annotations"].items()
    argv = kwok_config.argv("/bin/kwok", "/k/admin.kubeconfig", "/k/kwok.yaml")
    assert f"--manage-nodes-with-annotation-selector={key}={value}" in argv
    assert not any(a.startswith("--manage-all-nodes") for a in argv)  # a real node beside them stays its own
    assert "--config=/k/kwok.yaml" in argv and "--kubeconfig=/k/admin.kubeconfig" in argv
    assert not any(a.startswith("--server-address") for a in argv)  # no port taken


def test_pod_and_node_addresses_are_loopback_and_apart() -> None:
    cidrs = [ipaddress.ip_network(kwok_config.pod_cidr(i)) for i in range(kwok_config.MAX_NODES)]
    ips = [ipaddress.ip_address(kwok_config.node_ip(i)) for i in range(kwok_config.MAX_NODES)]
    assert all(c.is_loopback and c.prefixlen == 24 for c in cidrs)
    assert len(set(cidrs)) == len(cidrs)
    assert all(ip.is_loopback for ip in ips) and len(set(ips)) == len(ips)
    assert not any(ip in c for ip in ips for c in cidrs)
    node = kwok_config.fake_node(7, MI300X_SERVER)
    assert node["spec"]["podCIDR"] == kwok_config.pod_cidr(7) == "127.214.7.0/24"
    with pytest.raises(ValueError):
        kwok_config.pod_cidr(kwok_config.MAX_NODES)


def test_stages_make_nodes_ready_pods_running_and_deleted_pods_go() -> None:
    stages = yaml.safe_load_all(yaml.safe_dump_all(kwok_config.stages()))  # as kwok reads its --config
    by_name = {s["metadata"]["name"]: s for s in stages}
    assert set(by_name) == {"node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete"}
    assert all(s["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and s["kind"] == "Stage" for s in by_name.values())
    kinds = {name: s["spec"]["resourceRef"] for name, s in by_name.items()}
    assert kinds["node-initialize"] == {"apiGroup": "v1", "kind": "Node"}
    assert kinds["pod-ready"] == {"apiGroup": "v1", "kind": "Pod"}
    assert "phase: Running" in by_name["node-initialize"]["spec"]["next"]["statusTemplate"]
    ready = by_name["pod-ready"]["spec"]["next"]["statusTemplate"]
    assert "type: Ready" in ready and "phase: Running" in ready and "PodIPsWith" in ready
    assert by_name["pod-delete"]["spec"]["next"] == {"delete": True}
    heartbeat = by_name["node-heartbeat-with-lease"]["spec"]
    assert heartbeat["delay"]["durationMilliseconds"] >= 300_000 and heartbeat["immediateNextStage"] is True


def test_stage_selectors_do_not_overlap_for_a_pod() -> None:
    """A pending pod is readied, a running Job pod completed, a deleted pod removed: one stage each."""
    stages = {s["metadata"]["name"]: s["spec"]["selector"]["matchExpressions"] for s in kwok_config.stages()}
    deleting = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    assert deleting in stages["pod-ready"] and deleting in stages["pod-complete"]
    assert stages["pod-delete"] == [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}]


def test_pod_requests_sum_containers_and_take_the_larger_init_container() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
                {"resources": {"requests": {"cpu": "100m", "memory": "128Mi", "amd.com/gpu": "4"}}},
                {"resources": {"limits": {"cpu": "2"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
        }
    }
    assert kwok_config.pod_requests(pod) == pytest.approx({"cpu": 1.0, "memory": 0.25, "amd.com/gpu": 4.0})


def test_nodes_needed_follows_the_scarcest_resource() -> None:
    sim = {"cpu": 0.3, "memory": 0.3125}  # the benchmark's simulated pod: no GPUs
    assert kwok_config.nodes_needed(100, sim, MI300X_SERVER) == 1
    assert kwok_config.nodes_needed(111, sim, MI300X_SERVER) == 2  # the kubelet's 110 pods
    assert kwok_config.nodes_needed(100, {**sim, "amd.com/gpu": 8}, MI300X_SERVER) == 100
    assert kwok_config.nodes_needed(10, {"cpu": 16}, MachineShape(cpus=32, memory_gib=64)) == 5
    assert kwok_config.nodes_needed(0, sim, MI300X_SERVER) == 1
    with pytest.raises(ValueError, match="fits no fake node"):
        kwok_config.nodes_needed(1, {"amd.com/gpu": 9}, MI300X_SERVER)
    with pytest.raises(ValueError, match="no"):
        kwok_config.nodes_needed(1, {"nvidia.com/gpu": 1}, MI300X_SERVER)
