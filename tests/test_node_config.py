"""e2e/node_config.py, a real node's names and configuration files: two nodes on one machine share nothing
that would make one see or undo the other, and each file says what this kind of machine needs
(docs/e2e-real-node.md; e2e/tests/test_real_node.py runs them for real)."""

from __future__ import annotations

import json
import tomllib

from e2e import node_config
from e2e.node_config import NodeLayout


def _layout(name: str, run_id: str, node_ip: str) -> NodeLayout:
    return NodeLayout(
        name=name,
        run_id=run_id,
        root=f"/tmp/cluster/nodes/{name}",
        node_ip=node_ip,
        gateway="10.213.7.1",
        prefix=24,
        bridge="pdcl1234",
        cgroup_parent="/process_api/abc",
        pod_cidr="10.213.16.0/24",
    )


NODE = _layout("mi300x-0", "a1b2", "10.213.7.2")
OTHER = _layout("mi300x-1", "c3d4", "10.213.7.3")


def _machine_names(layout: NodeLayout) -> set[str]:
    return {
        layout.netns,
        layout.veth_host,
        layout.veth_node,
        layout.cgroup_root,
        layout.cni_network,
        layout.containerd_socket,
        layout.containerd_root,
        layout.containerd_state,
        layout.kubelet_root,
        layout.pod_logs_dir,
        layout.cni_ipam_dir,
    }


def test_two_nodes_share_no_name_on_the_machine_and_links_fit_the_kernels_limit() -> None:
    assert not _machine_names(NODE) & _machine_names(OTHER)
    assert all(len(name) <= 15 for name in (NODE.veth_host, NODE.veth_node))  # IFNAMSIZ - 1
    assert NODE.cgroup_root == "/process_api/abc/pd-e2e-node-a1b2"  # below the harness's own cgroup
    assert NODE.daemon_cgroup.startswith(NODE.cgroup_root + "/")
    assert NODE.device_plugin_dir == f"{NODE.kubelet_root}/device-plugins"
    assert NodeLayout.from_dict(NODE.as_dict()) == NODE


def test_containerd_runs_what_this_machine_allows_and_keeps_to_the_nodes_directories() -> None:
    config = tomllib.loads(node_config.containerd_config(NODE, "localhost/pd-operator/pause:0.1.0"))
    assert config["root"].startswith(NODE.root) and config["state"].startswith(NODE.root)
    assert config["grpc"]["address"] == NODE.containerd_socket
    assert "io.containerd.internal.v1.opt" in config["disabled_plugins"]  # it would write /opt/containerd
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE: the sandbox's -998 fails
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == "localhost/pd-operator/pause:0.1.0"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": node_config.RUNC, "SystemdCgroup": False}
    assert cri["cni"]["conf_dir"] == NODE.cni_conf_dir and cri["cni"]["conf_template"] == NODE.cni_template


def test_the_cni_template_bridges_pods_in_the_nodes_pod_cidr_without_masquerading() -> None:
    template = json.loads(node_config.cni_template(NODE))
    bridge = template["plugins"][0]
    assert template["name"] == NODE.cni_network
    assert bridge["type"] == "bridge" and bridge["isGateway"] and not bridge["ipMasq"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "{{.PodCIDR}}"}]]  # containerd fills in spec.podCIDR
    assert bridge["ipam"]["dataDir"] == NODE.cni_ipam_dir


def test_the_kubelet_uses_cgroupfs_on_cgroup_v1_and_the_nodes_own_dns_sockets_and_cgroups() -> None:
    config = node_config.kubelet_config(NODE, "/pki/ca.crt")
    assert (config["cgroupDriver"], config["failCgroupV1"], config["failSwapOn"]) == ("cgroupfs", False, False)
    assert config["cgroupRoot"] == NODE.cgroup_root
    assert config["containerRuntimeEndpoint"] == f"unix://{NODE.containerd_socket}"
    assert config["clusterDNS"] == [NODE.node_ip] and config["address"] == NODE.node_ip
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["imageGCHighThresholdPercent"] == 100  # imported images are never collected
    assert config["podLogsDir"] == NODE.pod_logs_dir


def test_kube_proxy_masquerades_everything_and_leaves_machine_wide_conntrack_settings_alone() -> None:
    config = node_config.kube_proxy_config(NODE, "/kubeconfig", "10.213.16.0/20")
    assert config["mode"] == "iptables" and config["iptables"]["masqueradeAll"] is True
    assert config["conntrack"]["maxPerCore"] == 0 and config["conntrack"]["min"] == 0
    assert config["hostnameOverride"] == NODE.name and config["clusterCIDR"] == "10.213.16.0/20"


def test_coredns_answers_on_the_node_address_from_the_api_and_forwards_nothing() -> None:
    corefile = node_config.corefile(NODE, "/coredns.kubeconfig")
    assert f"bind {NODE.node_ip}" in corefile
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in corefile
    assert "kubeconfig /coredns.kubeconfig" in corefile
    assert "forward" not in corefile


def test_rbac_lets_the_api_server_reach_kubelets_and_coredns_read_services() -> None:
    objects = {obj["metadata"]["name"]: obj for obj in node_config.node_rbac("apiserver-client", "dns-user")}
    kubelet_api = objects["pd-e2e:kubelet-api"]
    assert kubelet_api["roleRef"]["name"] == "system:kubelet-api-admin"
    assert kubelet_api["subjects"][0]["name"] == "apiserver-client"
    assert objects["pd-e2e:coredns"]["subjects"][0]["name"] == "dns-user"


def test_a_shaped_node_shows_its_kubelet_the_cpus_and_memory_of_its_shape_and_no_cpu_topology() -> None:
    files = node_config.machine_files(node_config.MachineShape(cpus=8, memory_gib=16))
    assert "MemTotal: 16777216 kB\n" in files["meminfo"]  # cAdvisor's memory capacity
    assert files["cpu/online"] == "0-7\n"
    assert sorted(path for path in files if path.startswith("cpu/cpu")) == [f"cpu/cpu{i}/online" for i in range(8)]
    # no core or package id, no NUMA node: no topology, so no CPU the machine lacks in the kubepods cpuset
    assert not [path for path in files if "topology" in path or path.startswith("node/")]

    shaped, plain = node_config.node_mounts(NODE, shaped=True), node_config.node_mounts(NODE, shaped=False)
    for name, target in node_config.MACHINE_MOUNTS.items():
        assert f"mount --bind {NODE.machine_dir}/{name} {target};" in shaped
        assert target not in plain
    assert f"mount --bind {NODE.kubelet_root} {node_config.NODE_KUBELET_ROOT};" in plain
    assert plain.endswith('exec "$@"') and shaped.endswith('exec "$@"')
