"""A real node: containerd, a kubelet, kube-proxy and CoreDNS in a network namespace, a mount namespace and
a cgroup tree of their own.

The harness makes the node's network namespace (a veth to the cluster bridge, the node's address and a
default route via the bridge, where the API server listens), a cgroup tree (the kubelet's cgroupRoot:
pods under kubepods, the node's daemons under system) and a directory. containerd starts in a new mount
namespace (`unshare --mount --propagation slave`) where /var/lib, /var/log and /run are the node's own:
the kubelet's fixed paths (/var/lib/kubelet: its root, certificates, device-plugin and DRA sockets; the
links in /var/log/containers), libcni's cache and the shims' and runc's state live there, and so do every
mount the node makes. The other daemons join both namespaces (`nsenter`) and the cgroup. Nothing of a
node is in the machine's mount table or fixed paths, and teardown works from the recorded layout alone:
freeze the cgroup tree and kill everything in it (the mount namespace and its mounts go with the last
process), then remove the cgroups, the network namespace, its route and the directory (`teardown`).
docs/e2e-real-node.md has the whole picture.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e import node_config, pki
from e2e.cluster import REPO_ROOT, ControlPlane, kubeconfig_dict
from e2e.node_config import MachineShape, NodeLayout
from e2e.procs import ProcRef, is_running, spawn, stop

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
CONTAINERD_NAMESPACE = "k8s.io"
APISERVER_KUBELET_CLIENT = "kube-apiserver-kubelet-client"  # the CN of pki's kubelet client certificate
COREDNS_USER = "system:pd-e2e:coredns"
IMAGES_BUILD = REPO_ROOT / "images" / "build.sh"
NODE_IMAGE_ROLES = ("pause", "operator", "runtime")  # what every node holds; others are imported on demand
# A per-node plugin (device plugin, DRA driver): its argv from the node's layout, which names the
# kubelet's socket directories. Started in the node's network namespace and cgroup once the kubelet runs.
NodePlugin = Callable[[NodeLayout], list[str]]


@dataclass(frozen=True)
class NodeImage:
    """A docker-archive to import into every node's containerd, and the names it must answer to there."""

    archive: Path
    names: tuple[str, ...]


@dataclass(frozen=True)
class ImageManifest:
    """What images/build.sh built (docs/images.md): image name -> docker-archive, role -> image name."""

    images: dict[str, str]
    roles: dict[str, str]

    @classmethod
    def load(cls, path: str | None = None) -> ImageManifest:
        """The manifest at `path`, else the one named by $PD_E2E_IMAGE_MANIFEST, else the one images/build.sh
        builds or reuses."""
        data = json.loads(Path(path or os.environ.get("PD_E2E_IMAGE_MANIFEST") or _built_manifest()).read_text())
        return cls(images=data["images"], roles=data["roles"])

    def role(self, role: str) -> str:
        return self.roles[role]

    def node_images(self, roles: Iterable[str] = NODE_IMAGE_ROLES) -> list[NodeImage]:
        return [self.image_as(role, self.roles[role]) for role in roles]

    def image_as(self, role: str, name: str) -> NodeImage:
        """The image of `role` under `name` on a node (a test image under the name the examples use)."""
        return NodeImage(Path(self.images[self.roles[role]]), (name,))


@functools.cache
def _built_manifest() -> str:
    """images/build.sh once per process (a warm run still takes about 10 s to check every image): the tree it
    builds from does not change while a test session, or `make cluster-up`, starts its nodes."""
    if not IMAGES_BUILD.exists():
        raise FileNotFoundError(f"{IMAGES_BUILD} is missing: set PD_E2E_IMAGE_MANIFEST to an image manifest")
    out = subprocess.run(["bash", str(IMAGES_BUILD)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def node_root(run_id: str) -> Path:
    """A node's directory: short, since the sockets in it (containerd's, the kubelet's plugin sockets) must
    fit a unix socket path (104 bytes for containerd); the cluster's work directory links to it."""
    return Path(tempfile.gettempdir()) / f"pd-node-{run_id}"


def proc_name(component: str, node: str) -> str:
    return f"{component}-{node}"


def own_memory_cgroup() -> str:
    """The harness's own memory cgroup: nodes nest below it, so what they use is counted where the
    harness's memory is (the machine may account each session's memory in its own cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


def hierarchies() -> list[Path]:
    """The machine's cgroup v1 hierarchies (the kubelet's cgroupfs driver uses them all)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, *_ = line.split()
        if fstype == "cgroup" and target.startswith(str(CGROUP_FS)):
            found.append(Path(target))
    return found


class RealNode:
    """Starts one node of `cp` as laid out by `layout`; every process is registered with `cp`."""

    def __init__(self, cp: ControlPlane, layout: NodeLayout, detach: bool = False) -> None:
        self.cp = cp
        self.layout = layout
        self.detach = detach
        self.root = Path(layout.root)

    # ---- start ---------------------------------------------------------------------------------------------

    def start(
        self,
        images: Iterable[NodeImage],
        sandbox_image: str,
        labels: Mapping[str, str] | None = None,
        taints: Iterable[str] = (),
        plugins: Mapping[str, NodePlugin] | None = None,
        shape: MachineShape | None = None,
    ) -> None:
        """Bring the node up until its Node has a pod CIDR; the caller waits for Ready. `shape`: the host
        its kubelet sees (cpu and memory capacity) instead of this machine."""
        self._record()  # first, so that teardown finds whatever of it was made
        self.root.mkdir(parents=True)
        link = self.cp.workdir / "nodes" / self.layout.name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(self.root)
        self._write_files(sandbox_image)
        if shape is not None:
            self._write_machine_files(shape)
        self._plug_network()
        self._make_cgroups()
        self._start_containerd(shaped=shape is not None)
        self._start_kubelet(labels or {}, taints)
        layout, config = self.layout, self.layout.config_file
        self._start("kube-proxy", [self.cp.tool("kube-proxy"), f"--config={config('kube-proxy.yaml')}"])
        self._start("coredns", [self.cp.tool("coredns"), "-conf", config("Corefile")])
        for directory in (layout.device_plugin_dir, layout.plugin_registry_dir, layout.plugins_dir):
            Path(directory).mkdir(exist_ok=True)  # a plugin may start before the kubelet made them
        for name, argv in (plugins or {}).items():
            self._start(f"plugin-{name}", argv(layout))
        for image in images:  # while the kubelet registers; nothing is scheduled here before start returns
            self.import_image(image)

    def _write_files(self, sandbox_image: str) -> None:
        layout = self.layout
        for directory in (layout.config_dir, layout.logs_dir, layout.cni_conf_dir, layout.cni_ipam_dir):
            Path(directory).mkdir(parents=True, exist_ok=True)
        config = Path(layout.config_dir)
        pki_dir = self.cp.workdir / "pki"
        identities = {
            "kubelet": (f"system:node:{layout.name}", ("system:nodes",)),
            "kube-proxy": ("system:kube-proxy", ()),
            "coredns": (COREDNS_USER, ()),
        }
        for component, (user, groups) in identities.items():
            cert, key = pki.client_cert(pki_dir, f"{component}-{layout.name}", user, groups)
            kubeconfig = kubeconfig_dict(self.cp.server, self.cp.ca_file, "", user)
            kubeconfig["users"][0]["user"] = {"client-certificate": str(cert), "client-key": str(key)}
            path = config / f"{component}.kubeconfig"
            path.write_text(yaml.safe_dump(kubeconfig))
            path.chmod(0o600)
        (config / "containerd.toml").write_text(node_config.containerd_config(layout, sandbox_image))
        Path(layout.cni_template).write_text(node_config.cni_template(layout))
        kubelet = node_config.kubelet_config(layout, str(self.cp.ca_file))
        (config / "kubelet.yaml").write_text(json.dumps(kubelet, indent=2))
        proxy = node_config.kube_proxy_config(layout, str(config / "kube-proxy.kubeconfig"), self.cp.cluster_cidr)
        (config / "kube-proxy.yaml").write_text(json.dumps(proxy, indent=2))
        (config / "Corefile").write_text(node_config.corefile(layout, str(config / "coredns.kubeconfig")))
        (config / "resolv.conf").write_text(node_config.resolv_conf(layout))

    def _write_machine_files(self, shape: MachineShape) -> None:
        root = Path(self.layout.machine_dir)
        files = node_config.machine_files(shape)
        for name, content in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        for name in node_config.MACHINE_MOUNTS.keys() - files.keys():  # an empty directory: no NUMA node
            (root / name).mkdir(parents=True, exist_ok=True)

    def _plug_network(self) -> None:
        layout = self.layout
        _ip("netns", "add", layout.netns)
        _ip("link", "add", layout.veth_host, "type", "veth", "peer", "name", layout.veth_node)
        _ip("link", "set", layout.veth_node, "netns", layout.netns)
        _ip("link", "set", layout.veth_host, "master", layout.bridge, "up")
        inside = ("-n", layout.netns)
        _ip(*inside, "link", "set", layout.veth_node, "name", "eth0")
        _ip(*inside, "addr", "add", f"{layout.node_ip}/{layout.prefix}", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        # the kubelet takes its node IP from the default route's interface; the bridge side is the API server
        _ip(*inside, "route", "add", "default", "via", layout.gateway)
        _in_netns(layout.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")  # pods' traffic through the node

    def _make_cgroups(self) -> None:
        """The cgroupRoot in every hierarchy (the kubelet refuses a missing one), and the daemons' cgroup."""
        created: list[str] = []
        for hierarchy in hierarchies():
            missing = []
            path = hierarchy / self.layout.cgroup_root.lstrip("/")
            while not path.exists():
                missing.append(path)
                path = path.parent
            for directory in reversed(missing):
                directory.mkdir()
                created.append(str(directory))
                _inherit_cpuset(directory)
            if hierarchy.name in node_config.DAEMON_HIERARCHIES:
                daemons = hierarchy / self.layout.daemon_cgroup.lstrip("/")
                daemons.mkdir(exist_ok=True)
        self._record(created_cgroups=created)

    def _record(self, **state: Any) -> None:
        """Facts teardown needs beyond the layout (the cgroups this node created), kept in the cluster state."""
        nodes = self.cp.extras.setdefault("real_nodes", {})
        nodes.setdefault(self.layout.name, {"layout": self.layout.as_dict()}).update(state)
        self.cp.save()

    def _start(self, component: str, argv: list[str], mount_ns: bool = True) -> ProcRef:
        """`argv` in the node's namespaces (the mount namespace of its containerd unless `mount_ns` is
        False, for containerd itself, which makes it) and its daemons' cgroup."""
        layout = self.layout
        cgroups = [
            h / layout.daemon_cgroup.lstrip("/") / "cgroup.procs"
            for h in hierarchies()
            if h.name in node_config.DAEMON_HIERARCHIES
        ]
        enter = ["nsenter", f"--net=/run/netns/{layout.netns}"]
        if mount_ns:
            enter.append(f"--mount=/proc/{self._containerd().pid}/ns/mnt")
        wrapped = [*enter, "--", *argv]
        ref, _ = spawn(
            proc_name(component, layout.name), wrapped, self._log(component), detach=self.detach, cgroups=cgroups
        )
        self.cp.register(ref)
        return ref

    def _containerd(self) -> ProcRef:
        return next(p for p in self.cp.procs if p.name == proc_name("containerd", self.layout.name))

    def _log(self, component: str) -> Path:
        return Path(self.layout.logs_dir) / f"{component}.log"

    def _start_containerd(self, shaped: bool) -> None:
        Path(self.layout.kubelet_root).mkdir()
        containerd = ["containerd", f"--config={self.layout.config_file('containerd.toml')}"]
        script = node_config.node_mounts(self.layout, shaped)
        own_mounts = ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "pd-node-mounts"]
        ref = self._start("containerd", [*own_mounts, *containerd], mount_ns=False)
        socket = Path(self.layout.containerd_socket)
        _wait(lambda: socket.exists() and self._ctr_ok(), 60, "containerd's socket", ref, self._log("containerd"))

    def _ctr_ok(self) -> bool:
        return subprocess.run(self._ctr("version"), capture_output=True).returncode == 0

    def _ctr(self, *args: str) -> list[str]:
        return ["ctr", "--address", self.layout.containerd_socket, "--namespace", CONTAINERD_NAMESPACE, *args]

    def import_image(self, image: NodeImage) -> None:
        """Import a docker-archive and tag it with every name pods use, so IfNotPresent never pulls."""
        started = time.monotonic()
        out = _run(self._ctr("images", "import", "--no-unpack=false", str(image.archive)))
        imported = [line.split()[1] for line in out.splitlines() if line.startswith("unpacking ")]
        if not imported:
            raise RuntimeError(f"ctr imported nothing from {image.archive}: {out.strip()}")
        for name in image.names:
            if name != imported[0]:
                _run(self._ctr("images", "tag", "--force", imported[0], name))
        self._drop_layer_blobs(imported[0])
        took = time.monotonic() - started
        log.info("node %s: imported %s as %s (%.1fs)", self.layout.name, image.archive.name, image.names, took)

    def _drop_layer_blobs(self, name: str) -> None:
        """Remove the image's layer blobs from the content store once they are unpacked: containers start
        from the snapshots (the manifest and config stay, and the config's labels keep the snapshots), so
        the node holds an image once on disk, not twice (the vllm-cpu image: 6.9 GB, not 13.8)."""
        (digest,) = [row[2] for row in map(str.split, _run(self._ctr("images", "ls")).splitlines()) if row[0] == name]
        manifest = json.loads(_run(self._ctr("content", "get", digest)))
        if "manifests" in manifest:  # an index: the one platform's manifest
            manifest = json.loads(_run(self._ctr("content", "get", manifest["manifests"][0]["digest"])))
        _run(self._ctr("content", "rm", *(layer["digest"] for layer in manifest["layers"])))

    def _start_kubelet(self, labels: Mapping[str, str], taints: Iterable[str]) -> None:
        layout = self.layout
        argv = [
            self.cp.tool("kubelet"),
            f"--config={layout.config_file('kubelet.yaml')}",
            f"--kubeconfig={layout.config_file('kubelet.kubeconfig')}",
            f"--hostname-override={layout.name}",
            f"--node-ip={layout.node_ip}",
        ]
        if labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        if taint_list := list(taints):
            argv.append("--register-with-taints=" + ",".join(taint_list))
        self._start("kubelet", argv)

    # ---- pod network -----------------------------------------------------------------------------------------

    def wait_pod_cidr(self, timeout_s: float = 90) -> str:
        """The Node's spec.podCIDR (allocated by the controller-manager once the kubelet registered)."""
        ref = next(p for p in self.cp.procs if p.name == proc_name("kubelet", self.layout.name))

        def allocated() -> str | None:
            with self.cp.http() as client:
                resp = client.get(f"/api/v1/nodes/{self.layout.name}")
            return str(resp.json()["spec"].get("podCIDR", "")) or None if resp.status_code == 200 else None

        return str(_wait(allocated, timeout_s, f"node {self.layout.name}'s pod CIDR", ref, self._log("kubelet")))

    # ---- measurements ------------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """What the whole node uses now (its daemons and pods), from its memory cgroup."""
        path = CGROUP_FS / "memory" / self.layout.cgroup_root.lstrip("/") / "memory.usage_in_bytes"
        return int(path.read_text())


def route_pods(layouts: Iterable[NodeLayout]) -> None:
    """Every node's pod CIDR reachable from the machine and from every other node, via that node's address."""
    known = [layout for layout in layouts if layout.pod_cidr]
    for layout in known:
        _ip("route", "replace", layout.pod_cidr, "via", layout.node_ip, "dev", layout.bridge)
        for other in known:
            if other.name != layout.name:
                _ip("-n", other.netns, "route", "replace", layout.pod_cidr, "via", layout.node_ip)


def node_rbac(cp: ControlPlane) -> None:
    """Cluster-wide grants the nodes' clients need (node_config.node_rbac)."""
    manifests = node_config.node_rbac(APISERVER_KUBELET_CLIENT, COREDNS_USER)
    cp.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))


def wait_dns_ready(layout: NodeLayout, timeout_s: float = 60) -> None:
    """CoreDNS answers once its kubernetes plugin has synced Services from the API."""
    url = f"http://{layout.node_ip}:{node_config.DNS_READY_PORT}/ready"
    _wait(lambda: _http_ok(url), timeout_s, f"CoreDNS on {layout.name}")


# ---- teardown ------------------------------------------------------------------------------------------------


def teardown(cp: ControlPlane, state: Mapping[str, Any]) -> None:
    """Remove one node from what was recorded: its processes and containers, shims' sockets, mounts,
    cgroups, network namespace and routes, links to its logs, libcni's cache of it, its directory."""
    layout = NodeLayout.from_dict(state["layout"])
    for ref in [p for p in cp.procs if p.name.endswith(f"-{layout.name}") and _is_kubelet_side(p.name)]:
        stop(ref, grace_s=5)  # the kubelet first, so it restarts nothing
    _kill_cgroup_tree(layout)  # the node's mount namespace, and every mount in it, goes with it
    for ref in [p for p in cp.procs if p.name.endswith(f"-{layout.name}")]:
        stop(ref, grace_s=1)  # gone already: reaps them
        cp.procs.remove(ref)
    _remove_cgroups(layout, state.get("created_cgroups", []))
    if layout.pod_cidr:
        _ip("route", "del", layout.pod_cidr, "via", layout.node_ip, check=False)
    _ip("netns", "del", layout.netns, check=False)  # its veth pair, bridge, iptables rules go with it
    _ip("link", "del", layout.veth_host, check=False)
    shutil.rmtree(layout.root, ignore_errors=True)
    (cp.workdir / "nodes" / layout.name).unlink(missing_ok=True)
    cp.extras.get("real_nodes", {}).pop(layout.name, None)
    cp.save()
    log.info("node %s torn down", layout.name)


def node_path(cp: ControlPlane, node: str, path: str) -> Path:
    """`path` of a running node's filesystem as the machine reaches it: through its containerd's root, in the
    node's mount namespace, where /var/lib, /var/log and /run are the node's own tmpfs and a pod's hostPath
    is resolved. The node's disk, for a test that puts files where a hostPath names them."""
    containerd = next(p for p in cp.procs if p.name == proc_name("containerd", node))
    return Path(f"/proc/{containerd.pid}/root") / path.lstrip("/")


def power_off(cp: ControlPlane, layout: NodeLayout) -> None:
    """The node's machine goes away at once: every process of its cgroup tree (kubelet, containerd and its
    shims, every container, kube-proxy, CoreDNS, plugins) SIGKILLed together, no graceful step, and its
    link down, so its address answers nothing. The Node is left to the node lifecycle controller; the
    namespace, cgroups and directory stay until `teardown`."""
    _kill_cgroup_tree(layout)
    for ref in [p for p in cp.procs if p.name.endswith(f"-{layout.name}")]:
        stop(ref, grace_s=1)  # gone already: reaps them
    _ip("-n", layout.netns, "link", "set", "eth0", "down")
    log.info("node %s powered off", layout.name)


def _is_kubelet_side(name: str) -> bool:
    return not name.startswith("containerd-")


def _cgroup_pids(layout: NodeLayout) -> list[int]:
    root = CGROUP_FS / "pids" / layout.cgroup_root.lstrip("/")
    if not root.exists():
        return []
    pids: list[int] = []
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in procs.read_text().split()]
    return pids


def _kill_cgroup_tree(layout: NodeLayout, timeout_s: float = 30) -> None:
    """Freeze the node's whole cgroup tree, SIGKILL every process in it, thaw: nothing forks meanwhile."""
    freezer = CGROUP_FS / "freezer" / layout.cgroup_root.lstrip("/") / "freezer.state"
    deadline = time.monotonic() + timeout_s
    while pids := _cgroup_pids(layout):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {layout.name}: processes {pids} survived SIGKILL")
        if freezer.exists():
            freezer.write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer.exists():
            freezer.write_text("THAWED")
        time.sleep(0.1)


def _remove_cgroups(layout: NodeLayout, created: Iterable[str]) -> None:
    """The node's cgroups in every hierarchy (deepest first), then the parents it created for them."""
    for top in CGROUP_FS.iterdir():
        root = top / layout.cgroup_root.lstrip("/")
        if root.is_dir():
            tree = [root, *(p for p in root.rglob("*") if p.is_dir())]
            for directory in sorted(tree, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
    for parent in sorted(created, key=len, reverse=True):
        with contextlib.suppress(OSError):
            Path(parent).rmdir()


def leftovers(layout: NodeLayout) -> list[str]:
    """What of this node is still on the machine (empty after teardown): for the teardown test."""
    found = []
    if _cgroup_pids(layout):
        found.append(f"processes in {layout.cgroup_root}")
    cgroups = [top / layout.cgroup_root.lstrip("/") for top in CGROUP_FS.iterdir()]
    found += [f"cgroup {path}" for path in cgroups if path.exists()]
    with open("/proc/self/mountinfo") as mountinfo:
        found += [f"mount {line.split()[4]}" for line in mountinfo if layout.root in line.split()[4]]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found += [f"netns {layout.netns}"] if layout.netns in netns else []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {name}" for name in (layout.veth_host, layout.veth_node) if f" {name}@" in links]
    if layout.pod_cidr and layout.pod_cidr in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout:
        found.append(f"route {layout.pod_cidr}")
    found += [f"directory {layout.root}"] if Path(layout.root).exists() else []
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            if layout.root.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(f"process {pid}")
    return found


def container_pid(layout: NodeLayout, container_id: str) -> int:
    """The machine's pid of a container's first process (pid 1 of its pid namespace), found through its
    cgroup: with the cgroupfs driver each container's cgroup is named by its id (`containerd://` dropped)
    under the pod's, below `<cgroup_root>/kubepods`."""
    cid = container_id.split("://")[-1]
    kubepods = CGROUP_FS / "pids" / layout.cgroup_root.lstrip("/") / "kubepods"
    found = [path for path in kubepods.rglob(cid) if path.is_dir()] if cid else []
    if len(found) != 1:
        raise LookupError(f"node {layout.name}: no one cgroup of container {container_id!r} ({found})")
    for pid in (found[0] / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            nspids = next((line.split()[1:] for line in status if line.startswith("NSpid:")), [])
            if nspids and nspids[-1] == "1":
                return int(pid)
    raise LookupError(f"node {layout.name}: container {container_id} has no process of pid 1 in its namespace")


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


# ---- small helpers -------------------------------------------------------------------------------------------


def _inherit_cpuset(directory: Path) -> None:
    """A new cpuset cgroup has no CPUs or memory nodes until given its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        mine, parents = directory / name, directory.parent / name
        if mine.exists() and not mine.read_text().strip():
            mine.write_text(parents.read_text())


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _in_netns(netns: str, *argv: str) -> str:
    return _run(["nsenter", f"--net=/run/netns/{netns}", "--", *argv])


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(
    check: Callable[[], Any], timeout_s: float, what: str, ref: ProcRef | None = None, log_path: Path | None = None
) -> Any:
    """Until `check()` gives something; the error names what `ref` (a daemon) last logged if it exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ref is not None and not is_running(ref):
            tail = log_path.read_text(errors="replace").splitlines()[-10:] if log_path and log_path.exists() else []
            raise RuntimeError(f"{ref.name} exited while waiting for {what}; its log ends:\n" + "\n".join(tail))
        if result := check():
            return result
        time.sleep(0.3)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
