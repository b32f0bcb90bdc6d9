"""Pods under a real kubelet and containerd (docs/e2e-real-node.md): what the node agent can only imitate.

The node reports kubelet v1.36.3 and containerd 1.6; the operator runs in-cluster from its image; a pod's
probes, lifecycle hooks, restarts, downward API and `$(VAR)` expansion, `kubectl logs` and `exec`,
Service DNS through CoreDNS and kube-proxy, and the simulated 2P1D example with its goodput probe and KV
canary all run for real, every container a `containerd://` one. A second node, whose fake MI300X device
plugins register with its own kubelet, has a pod CIDR of its own and reaches the first's pods by IP and
through a Service (never through its endpoint that is not ready), and tearing a node (or a whole
`make cluster-up` cluster) down leaves nothing of it on the machine.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from e2e import device_plugins, netns, real_node
from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.node_config import NodeLayout
from e2e.stack import NODE_NAME, OPERATOR_NAMESPACE, POOL_KEY, Stack, pool_placement
from e2e.tests.kube import (
    Background,
    Obj,
    apply,
    condition,
    container_status,
    is_true,
    pod,
    pods,
    proxy_status,
    serving_pod,
    simulated_example,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

RUNTIME_IMAGE = "ghcr.io/pd-serving/pd-runtime:0.1.0"
STREAM_TOKENS = 1500  # about 6 s from the simulated engines at timeScale 10


def _containerd_ids(obj: Obj) -> list[str]:
    statuses = obj["status"].get("containerStatuses", []) + obj["status"].get("initContainerStatuses", [])
    return [str(status.get("containerID", "")) for status in statuses]


def _pod(name: str, command: list[str], **container: Any) -> Obj:
    spec = {"name": name, "image": RUNTIME_IMAGE, "imagePullPolicy": "IfNotPresent", "command": command}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 5, "containers": [spec | container]},
    }


def _web(name: str) -> Obj:
    """An HTTP server that says where it started, with the downward API's pod IP expanded by the kubelet."""
    return _pod(
        name,
        ["sh", "-c", "echo started on $(POD_IP); exec python3 -m http.server 8080"],
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        ports=[{"containerPort": 8080}],
        readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    )


def _service(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def _ready(cp: ControlPlane, namespace: str, name: str) -> Obj:
    def ready() -> Obj | None:
        found = pod(cp, namespace, name)
        return found if is_true(found, "Ready") else None

    return wait_for(ready, 120, f"pod {name} Ready")


def _exec(cp: ControlPlane, namespace: str, name: str, *argv: str) -> str:
    return cp.kubectl("exec", "-n", namespace, name, "--", *argv)


def _fetch(cp: ControlPlane, namespace: str, client: str, url: str) -> str:
    """What `url` answers from inside pod `client` (status line), or the error."""
    script = (
        "import sys, urllib.request\n"
        "try: print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
        "except Exception as err: print(repr(err))\n"
    )
    return _exec(cp, namespace, client, "python3", "-c", script, url).strip()


def _answers(cp: ControlPlane, namespace: str, client: str, url: str) -> None:
    """`url` answers 200 from pod `client` (a Service answers once kube-proxy has its ready endpoints)."""
    wait_for(lambda: _fetch(cp, namespace, client, url) == "200" or None, 30, f"{url} from {client}")


def test_the_node_runs_kubelet_and_containerd_and_the_operator_runs_from_its_image(cp: ControlPlane) -> None:
    node = json.loads(cp.kubectl("get", "node", NODE_NAME, "-o", "json"))
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6.")
    operator = pods(cp, OPERATOR_NAMESPACE)
    assert len(operator) == 1 and is_true(operator[0], "Ready")
    assert operator[0]["spec"]["containers"][0]["image"] == "ghcr.io/pd-serving/pd-operator:0.1.0"
    assert all(cid.startswith("containerd://") for cid in _containerd_ids(operator[0]))


def test_probes_hooks_restarts_downward_api_logs_and_exec_are_the_kubelets(cp: ControlPlane, namespace: str) -> None:
    manifest = _web("web")
    container = manifest["spec"]["containers"][0]
    container["startupProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 30}
    container["livenessProbe"] = {"exec": {"command": ["sh", "-c", "test ! -e /tmp/die"]}, "periodSeconds": 1}
    container["lifecycle"] = {
        "postStart": {"exec": {"command": ["sh", "-c", "echo poststart > /tmp/poststart"]}},
        "preStop": {"exec": {"command": ["sh", "-c", "echo prestop ran > /dev/termination-log"]}},
    }
    apply(cp, json.dumps(manifest), namespace)
    first = _ready(cp, namespace, "web")
    assert all(cid.startswith("containerd://") for cid in _containerd_ids(first))
    pod_ip = first["status"]["podIP"]
    assert f"started on {pod_ip}" in cp.kubectl("logs", "-n", namespace, "web")
    assert _exec(cp, namespace, "web", "cat", "/tmp/poststart") == "poststart\n"

    _exec(cp, namespace, "web", "touch", "/tmp/die")  # the liveness probe fails: preStop, then a new container

    def restarted() -> Obj | None:
        found = pod(cp, namespace, "web")
        status = container_status(found, "web")
        return found if status.get("restartCount") == 1 and status.get("ready") else None

    again = wait_for(restarted, 120, "web restarted by its liveness probe and Ready again")
    status = container_status(again, "web")
    assert status["lastState"]["terminated"]["message"] == "prestop ran\n"  # written by the preStop hook
    assert status["containerID"] != container_status(first, "web")["containerID"]
    assert status["containerID"].startswith("containerd://")
    assert _exec(cp, namespace, "web", "ls", "/tmp") == "poststart\n"  # a new container: fresh /tmp, hook ran again


def test_a_service_name_resolves_through_coredns_and_answers_through_kube_proxy(
    cp: ControlPlane, namespace: str
) -> None:
    for manifest in (_web("web"), _service("web"), _pod("client", ["sleep", "3600"])):
        apply(cp, json.dumps(manifest), namespace)
    _ready(cp, namespace, "web")
    _ready(cp, namespace, "client")
    cluster_ip = json.loads(cp.kubectl("get", "service", "-n", namespace, "web", "-o", "json"))["spec"]["clusterIP"]
    resolved = _exec(cp, namespace, "client", "python3", "-c", "import socket; print(socket.gethostbyname('web'))")
    assert resolved.strip() == cluster_ip
    _answers(cp, namespace, "client", "http://web/")  # once kube-proxy has the ready endpoint
    assert _fetch(cp, namespace, "client", f"http://web.{namespace}.svc.cluster.local/") == "200"
    assert "gaierror" in _fetch(cp, namespace, "client", "http://no-such-service/")  # fails at once, nothing forwarded


def test_the_simulated_2p1d_example_is_ready_with_goodput_and_a_verified_kv_transfer(
    cp: ControlPlane, namespace: str
) -> None:
    apply(cp, (REPO_ROOT / "examples" / "simulated-2p1d.yaml").read_text(), namespace)
    wait_pdd_ready(cp, namespace, "sim-2p1d", timeout_s=180)

    def verified() -> Obj | None:
        found = json.loads(cp.kubectl("get", "pdd", "-n", namespace, "sim-2p1d", "-o", "json"))
        return found if is_true(found, "KVTransferVerified") and is_true(found, "GoodputMet") else None

    obj = wait_for(verified, 240, "KVTransferVerified and GoodputMet True")
    assert condition(obj, "Ready") is not None and is_true(obj, "Ready")
    serving = pod(cp, namespace, obj["status"]["podName"])
    assert serving is not None and serving["spec"]["nodeName"] == NODE_NAME
    assert len(_containerd_ids(serving)) == 4
    for found in pods(cp, namespace):  # the serving pod and the goodput probe's Job pod
        assert all(cid.startswith("containerd://") for cid in _containerd_ids(found)), found["metadata"]["name"]


def test_a_stream_in_flight_when_the_pod_is_deleted_ends_whole_as_the_engines_wait_for_the_proxy(
    cp: ControlPlane, namespace: str
) -> None:
    """The engines' preStop hook (`pdctl wait-proxy-gone`) under the real kubelet: the kubelet sends the
    proxy SIGTERM and runs the engines' hooks, which hold the engines up (listening: they get SIGTERM only
    when the hook returns) while the proxy drains, so a request the proxy still takes in its drain delay is
    served, and a stream running when the proxy was told to leave gets every token."""
    obj = simulated_example("sim-drain")
    obj["spec"]["goodputProbe"] = {"enabled": False}
    obj["spec"]["terminationGracePeriodSeconds"] = 30
    apply(cp, json.dumps(obj), namespace)
    wait_pdd_ready(cp, namespace, "sim-drain", timeout_s=180)
    serving = serving_pod(cp, namespace, "sim-drain")
    with _Stream(serving["status"]["podIP"], max_tokens=STREAM_TOKENS) as stream:
        wait_for(lambda: stream.chunks or None, 30, "the stream's first token")
        cp.kubectl("delete", "pod", "-n", namespace, serving["metadata"]["name"], "--wait=false")
        wait_for(lambda: proxy_status(cp, serving)["leaving"] or None, 30, "the kubelet's SIGTERM to the proxy")
        at_leaving = len(stream.chunks)
        assert stream_completion(serving["status"]["podIP"])  # a new request, through engines still listening
        assert stream.finished.wait(60), "the stream did not end"
    assert stream.error is None, stream.error
    assert stream.chunks[-1] == "[DONE]" and len(stream.chunks) == STREAM_TOKENS + 1
    assert len(stream.chunks) - at_leaving >= STREAM_TOKENS // 4  # served while the proxy was leaving


@dataclass
class _Stream(Background):
    """A streamed completion through a pod's proxy, read in a thread of its own."""

    pod_ip: str
    max_tokens: int
    chunks: list[str] = field(default_factory=list)
    error: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        base = f"http://{self.pod_ip}:8000"
        try:
            model = httpx.get(f"{base}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
            body = {"model": model, "prompt": "Drain, then go.", "max_tokens": self.max_tokens, "stream": True}
            body |= {"ignore_eos": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60, trust_env=False) as resp:
                resp.raise_for_status()
                self.chunks.extend(line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: "))
        except httpx.HTTPError as err:
            self.error = repr(err)
        finally:
            self.finished.set()


def test_a_second_node_with_device_plugins_reaches_the_first_ones_pods_and_leaves_nothing_when_torn_down(
    stack: Stack, namespace: str
) -> None:
    cp = stack.cp
    iptables_before = _machine_iptables()
    extra, devices = "extra-0", {"devices": device_plugins.real_node_plugin()}
    images = real_node.ImageManifest.load().node_images(("pause", "runtime"))
    stack.start_real_node(extra, images, {POOL_KEY: "extra"}, (f"{POOL_KEY}=extra:NoSchedule",), devices)
    placed = _web("far")
    placed["spec"] |= pool_placement("extra")
    placed["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "1"}}  # from the node's plugin
    # Behind the same Service on the first node, never Ready: its EndpointSlice entry is not ready, so
    # kube-proxy must not send the Service's traffic there (it does not listen).
    never_ready = _pod("far-never-ready", ["sleep", "3600"], readinessProbe={"exec": {"command": ["false"]}})
    never_ready["metadata"]["labels"] = {"app": "far"}
    for manifest in (_web("near"), _service("far"), placed, never_ready, _pod("client", ["sleep", "3600"])):
        apply(cp, json.dumps(manifest), namespace)
    far = _ready(cp, namespace, "far")
    assert far["spec"]["nodeName"] == extra
    _ready(cp, namespace, "client")
    near = _ready(cp, namespace, "near")
    near_ip = near["status"]["podIP"]
    cidrs = {node: _pod_cidr(cp, node) for node in (NODE_NAME, extra)}
    assert cidrs[NODE_NAME] != cidrs[extra]
    assert all(cidr.subnet_of(ipaddress.IPv4Network(cp.cluster_cidr)) for cidr in cidrs.values())
    assert ipaddress.ip_address(far["status"]["podIP"]) in cidrs[extra]
    assert ipaddress.ip_address(near_ip) in cidrs[NODE_NAME]
    assert _fetch(cp, namespace, "client", f"http://{far['status']['podIP']}:8080/") == "200"  # across nodes by IP
    _answers(cp, namespace, "client", "http://far/")  # and through the Service
    fetched = [_fetch(cp, namespace, "client", f"http://far.{namespace}.svc.cluster.local/") for _ in range(8)]
    assert fetched == ["200"] * 8, "the Service sent traffic to its never-ready pod"
    assert _fetch(cp, namespace, "far", f"http://{near_ip}:8080/") == "200"  # and back
    assert _exec(cp, namespace, "far", "ls", "/dev/kfd").strip() == "/dev/kfd"  # the plugin's Allocate, by the kubelet

    state = cp.extras["real_nodes"][extra]
    layout = NodeLayout.from_dict(state["layout"])
    assert real_node.leftovers(layout)  # a running node has processes, mounts, a namespace, cgroups
    stack.remove_real_node(extra)
    assert real_node.leftovers(layout) == []
    assert _machine_iptables() == iptables_before


def _pod_cidr(cp: ControlPlane, node: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(json.loads(cp.kubectl("get", "node", node, "-o", "json"))["spec"]["podCIDR"])


def test_the_cluster_bridge_keeps_its_mac_when_a_port_comes_and_goes() -> None:
    """A bridge whose MAC followed its lowest port's would change it when a pod goes, and the other pods'
    traffic to the gateway would stall until they resolve it again."""
    bridge = f"pdmac{secrets.token_hex(2)}"
    port, address = f"{bridge}p", Path(f"/sys/class/net/{bridge}/address")
    netns.create_bridge(bridge)
    try:
        before = address.read_text()
        lowest = ["address", "00:00:00:00:00:01", "type", "veth", "peer", "name", f"{bridge}q"]
        subprocess.run(["ip", "link", "add", port, *lowest], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", port, "master", bridge], check=True, capture_output=True)
        assert address.read_text() == before
        subprocess.run(["ip", "link", "del", port], check=True, capture_output=True)
        assert address.read_text() == before
    finally:
        netns.delete_bridge(bridge)


def test_cluster_down_leaves_nothing_of_cluster_up_behind(tmp_path: Path) -> None:
    """`make cluster-up`, a pod on its node, `make cluster-down`: no process, mount, namespace, cgroup,
    route, bridge, iptables rule or file of it remains."""
    state_dir = tmp_path / "cluster"
    iptables_before = _machine_iptables()
    cli = [sys.executable, "-m", "e2e.cluster_cli", f"--state-dir={state_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    up = subprocess.run([*cli, "up", "--no-operator"], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr[-3000:]
    cp = ControlPlane.load(state_dir)
    try:
        apply(cp, json.dumps(_web("web")), "default")
        _ready(cp, "default", "web")
        layouts = [NodeLayout.from_dict(s["layout"]) for s in cp.extras["real_nodes"].values()]
        bridge = str(cp.extras["bridge"])
    finally:
        subprocess.run([*cli, "down"], check=True, env=env, cwd=REPO_ROOT, capture_output=True)
    assert layouts and all(real_node.leftovers(layout) == [] for layout in layouts)
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
    assert not [ref.name for ref in cp.procs if Path(f"/proc/{ref.pid}").exists() and _started_by(ref.pid, cp)]
    assert not state_dir.exists()
    assert _machine_iptables() == iptables_before


def _started_by(pid: int, cp: ControlPlane) -> bool:
    """Whether `pid` is still one of the cluster's processes (its command line names the cluster's files)."""
    try:
        return str(cp.workdir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _machine_iptables() -> list[str]:
    """The machine's own iptables rules (without iptables-save's dated comments); nodes keep theirs in
    their namespaces."""
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if not line.startswith("#")]
