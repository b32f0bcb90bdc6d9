"""What a real node is made of, as data: its names on the machine, its directories, and the configuration
files of its containerd, CNI, kubelet, kube-proxy and CoreDNS (docs/e2e-real-node.md).

Pure: every value follows from a `NodeLayout`, so two nodes on one machine never share a socket, a
directory, a network namespace or a cgroup, and teardown can find everything by the recorded layout.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc; crun refuses this machine's hybrid cgroups
KUBELET_PORT = 10250
DNS_READY_PORT = 8181
# The kubelet's root inside the node's mount namespace: its fixed paths (the device-plugin socket
# directory, /var/lib/kubelet/device-plugins, above all) are there, whatever --root-dir says.
NODE_KUBELET_ROOT = "/var/lib/kubelet"
# cgroup v1 hierarchies the node's daemons (containerd and its shims, kubelet, kube-proxy, CoreDNS) join:
# freezer stops the whole node at once, pids lists every process of it, memory counts its RSS.
DAEMON_HIERARCHIES = ("freezer", "memory", "pids")
# Where a shaped node's machine files (machine_files, under its machine_dir) are bound in its mount namespace:
# what cAdvisor reads for the kubelet's cpu and memory capacity. `node` is an empty directory.
MACHINE_MOUNTS = {
    "meminfo": "/proc/meminfo",
    "cpu": "/sys/devices/system/cpu",
    "node": "/sys/devices/system/node",
}


@dataclass(frozen=True)
class MachineShape:
    """The host a node's kubelet sees in place of this machine: its CPU count and memory, which become the
    Node's cpu and memory capacity. Only what the scheduler and the kubelet's admission count changes; the
    pods' real use is the machine's, and nothing is reserved."""

    cpus: int
    memory_gib: int


# An 8x MI300X server's host side (two 64-core sockets), enough for the seed examples' engines (16 CPUs and
# 96Gi each, docs/e2e-real-node.md).
MI300X_SERVER = MachineShape(cpus=128, memory_gib=1536)


@dataclass(frozen=True)
class NodeLayout:
    """One real node: its Node name, the run id in every name it has on the machine, its directory and
    addresses. Recorded in the cluster's state so `make cluster-down` can undo it from another process."""

    name: str
    run_id: str  # 4 hex digits
    root: str  # the node's directory: containerd, kubelet, CNI state and configuration, logs
    node_ip: str  # eth0 in the node's network namespace: the Node's InternalIP, CoreDNS, kubelet
    gateway: str  # the cluster bridge's address on the node network (the API server listens there)
    prefix: int  # of the node network
    bridge: str  # the cluster bridge in the machine's namespace
    cgroup_parent: str = "/"  # the node's cgroup tree goes below it (in every hierarchy)
    pod_cidr: str = ""  # spec.podCIDR, once the controller-manager has allocated it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeLayout:
        return cls(**data)

    # ---- names on the machine --------------------------------------------------------------------------

    @property
    def netns(self) -> str:
        return f"pdn-{self.run_id}"

    @property
    def veth_host(self) -> str:
        """The veth end on the cluster bridge (its peer is the node's eth0)."""
        return f"pdn{self.run_id}h"

    @property
    def veth_node(self) -> str:
        return f"pdn{self.run_id}n"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's cgroupRoot: pods under <root>/kubepods, the node's daemons under <root>/system."""
        return f"{self.cgroup_parent.rstrip('/')}/pd-e2e-node-{self.run_id}"

    @property
    def daemon_cgroup(self) -> str:
        return f"{self.cgroup_root}/system"

    @property
    def cni_network(self) -> str:
        """The CNI network's name, which also names libcni's cached results in /var/lib/cni/results."""
        return f"pd-e2e-{self.run_id}"

    # ---- directories and files -------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> str:
        return f"{self.root}/containerd.sock"

    @property
    def containerd_root(self) -> str:
        return f"{self.root}/containerd/root"

    @property
    def containerd_state(self) -> str:
        return f"{self.root}/containerd/state"

    @property
    def kubelet_root(self) -> str:
        """The kubelet's root as the machine sees it: bound at NODE_KUBELET_ROOT in the node's mount
        namespace (pods' volumes, its certificates, the plugin sockets)."""
        return f"{self.root}/kubelet"

    @property
    def device_plugin_dir(self) -> str:
        """Where device plugins find the kubelet's Registration socket (kubelet.sock) and put theirs, as
        the machine sees it (/var/lib/kubelet/device-plugins in the node)."""
        return f"{self.kubelet_root}/device-plugins"

    @property
    def plugin_registry_dir(self) -> str:
        """Where DRA drivers (and CSI) put their registration sockets for the kubelet's plugin watcher
        (/var/lib/kubelet/plugins_registry in the node)."""
        return f"{self.kubelet_root}/plugins_registry"

    @property
    def plugins_dir(self) -> str:
        """Where DRA drivers keep their service sockets (/var/lib/kubelet/plugins in the node)."""
        return f"{self.kubelet_root}/plugins"

    @property
    def pod_logs_dir(self) -> str:
        return f"{self.root}/pod-logs"

    @property
    def cni_conf_dir(self) -> str:
        return f"{self.root}/cni/net.d"

    @property
    def cni_template(self) -> str:
        return f"{self.root}/cni/template.conflist"

    @property
    def cni_ipam_dir(self) -> str:
        return f"{self.root}/cni/ipam"

    @property
    def config_dir(self) -> str:
        return f"{self.root}/config"

    @property
    def logs_dir(self) -> str:
        return f"{self.root}/logs"

    @property
    def machine_dir(self) -> str:
        """A shaped node's machine files (machine_files), bound over the machine's in its mount namespace."""
        return f"{self.root}/machine"

    def config_file(self, name: str) -> str:
        return f"{self.config_dir}/{name}"


def machine_files(shape: MachineShape) -> dict[str, str]:
    """What cAdvisor reads for the kubelet's machine info, as `shape` has it, by path under the node's
    machine_dir: /proc/meminfo's MemTotal, and `shape.cpus` CPUs, all online, with no NUMA node and no
    core or package ids. cAdvisor then counts the CPUs and reports no topology, so the kubelet (CPU manager
    policy none) leaves the pods' cpuset as the machine's; a topology would name CPUs this machine lacks,
    which the kubelet writes into the kubepods cpuset ("numerical result out of range")."""
    kib = shape.memory_gib * 1024 * 1024
    meminfo = "".join(f"{key}: {kib} kB\n" for key in ("MemTotal", "MemFree", "MemAvailable"))
    cpus = f"0-{shape.cpus - 1}\n"
    files = {"meminfo": meminfo + "SwapTotal: 0 kB\nSwapFree: 0 kB\n"}
    files |= {f"cpu/{name}": cpus for name in ("online", "possible", "present")}
    return files | {f"cpu/cpu{cpu}/online": "1\n" for cpu in range(shape.cpus)}


def node_mounts(layout: NodeLayout, shaped: bool) -> str:
    """The shell script containerd's new mount namespace runs before containerd (`exec "$@"`): the node's own
    tmpfs on /var/lib, /var/log and /run and its kubelet directory bound at the kubelet's fixed root; for a
    `shaped` node also its machine files over the machine's (MACHINE_MOUNTS)."""
    steps = [
        "set -e",
        'for dir in /var/lib /var/log /run; do mount -t tmpfs -o mode=755,size=64m pd-node "$dir"; done',
        f"mkdir -p {NODE_KUBELET_ROOT} /var/log/containers",
        f"mount --bind {shlex.quote(layout.kubelet_root)} {NODE_KUBELET_ROOT}",
    ]
    if shaped:
        for name, target in MACHINE_MOUNTS.items():
            steps.append(f"mount --bind {shlex.quote(f'{layout.machine_dir}/{name}')} {target}")
    return "; ".join([*steps, 'exec "$@"'])


def containerd_config(layout: NodeLayout, sandbox_image: str) -> str:
    """containerd's config.toml: its own root, state and socket, the CRI plugin as this machine needs it."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = {json.dumps(layout.containerd_root)}
state = {json.dumps(layout.containerd_state)}
# plugins that would write outside the node's directories, or need what this machine lacks
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {json.dumps(layout.containerd_socket)}

[{cri}]
  # no image registry is reachable: the pause image is imported, never pulled
  sandbox_image = {json.dumps(sandbox_image)}
  # without CAP_SYS_RESOURCE a negative oom_score_adj (the pause container's -998) fails every sandbox
  restrict_oom_score_adj = true
  disable_apparmor = true
  # pods' network namespaces under the node's state, not /var/run/netns
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = {json.dumps(RUNC)}
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = {json.dumps(CNI_BIN_DIR)}
    conf_dir = {json.dumps(layout.cni_conf_dir)}
    # rendered into conf_dir once the kubelet passes the node's spec.podCIDR (UpdateRuntimeConfig)
    conf_template = {json.dumps(layout.cni_template)}
"""


def cni_template(layout: NodeLayout) -> str:
    """containerd's CNI template: a bridge in the node's namespace, addresses from the node's pod CIDR.
    No ipMasq: pods keep their own address towards other nodes and the machine, which route to them."""
    config = {
        "cniVersion": "1.0.0",
        "name": layout.cni_network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": layout.cni_ipam_dir,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def kubelet_config(layout: NodeLayout, client_ca: str) -> dict[str, Any]:
    """The KubeletConfiguration: defaults except where this machine, or a node among several, needs
    otherwise (docs/e2e-real-node.md says why for each)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": layout.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "imageServiceEndpoint": f"unix://{layout.containerd_socket}",
        # containerd 1.6 has no RuntimeConfig RPC to say which driver it uses; it runs cgroupfs
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "failCgroupV1": False,  # the machine's hierarchy is cgroup v1 ("hybrid")
        "failSwapOn": False,
        "clusterDNS": [layout.node_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": layout.config_file("resolv.conf"),
        "podLogsDir": layout.pod_logs_dir,
        # images are imported, never pulled: nothing may garbage-collect them or evict for disk
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        # projected volumes (ConfigMaps) follow an update at the next pod sync: every 5 s, not every minute
        "syncFrequency": "5s",
    }


def kube_proxy_config(layout: NodeLayout, kubeconfig: str, cluster_cidr: str) -> dict[str, Any]:
    """iptables mode in the node's namespace, masquerading all Service traffic; conntrack left as the
    kernel has it (its table size and hash are machine-wide, not the node's to set)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": layout.name,
        "bindAddress": layout.node_ip,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "iptables": {"masqueradeAll": True},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(layout: NodeLayout, kubeconfig: str) -> str:
    """CoreDNS on the node's address: cluster names from the API, nothing forwarded (no traffic leaves
    the machine, so a name outside the cluster fails at once)."""
    return f""".:53 {{
    bind {layout.node_ip}
    errors
    ready {layout.node_ip}:{DNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""


def resolv_conf(layout: NodeLayout) -> str:
    """The node's own resolver (for dnsPolicy Default pods): its CoreDNS."""
    return f"nameserver {layout.node_ip}\noptions timeout:1 attempts:2\n"


def node_rbac(apiserver_kubelet_client: str, coredns_user: str) -> list[dict[str, Any]]:
    """What the node's clients may do beyond the defaults: the API server's kubelet client reaches the
    kubelet API (logs, exec; the kubelet asks with a SubjectAccessReview), CoreDNS reads Services."""
    coredns_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "pd-e2e:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    }
    return [
        coredns_role,
        _user_binding("pd-e2e:coredns", "pd-e2e:coredns", coredns_user),
        _user_binding("pd-e2e:kubelet-api", "system:kubelet-api-admin", apiserver_kubelet_client),
    ]


def _user_binding(name: str, role: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
