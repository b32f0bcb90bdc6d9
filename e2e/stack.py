"""The whole local stack on top of a ControlPlane: real nodes, operator install (chart), operator process.

Shared by the pytest fixtures, `make demo` and `make cluster-up`, so all three run the same way.

A cluster's nodes are real (`start_real_control_plane`, then `start_real_node`: a kubelet, containerd,
kube-proxy and CoreDNS each, e2e/real_node.py); the operator runs in-cluster from its image, or as our
process with the chart's ServiceAccount where a benchmark reads its memory (`start_operator`).

One node (`mi300x-0`) by default; `start_real_pool` adds a pool of more 8-GPU nodes, labelled and
tainted with the pool's name so that only workloads placed there on purpose (`pool_placement`) land on
them. All nodes share one pod network (one bridge, a /24 per node from the controller-manager's node
IPAM), so pods on different nodes reach each other and Service names resolve to pods on any node.
`fail_node` is the "node dies" fault of a real node: its kubelet, containerd, shims and containers
killed at once.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from e2e import netns, real_node
from e2e import pki as pki_mod
from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.node_config import MI300X_SERVER, MachineShape, NodeLayout
from e2e.procs import ProcRef, is_running, spawn, stop
from e2e.real_node import NodeImage, NodePlugin, RealNode

log = logging.getLogger(__name__)

NODE_NAME = "mi300x-0"
POOL_KEY = "pd.serving.dev/e2e-pool"  # label and NoSchedule taint of the nodes of a pool
GPU_POOL = "gpu"  # the real 8-GPU nodes the multi-node e2e tests share (a lost one is started again)
OPERATOR_NAMESPACE = "pd-system"
EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"  # the APIService of e2e.metrics_api
RELEASE = "pd-operator"
CHART = REPO_ROOT / "charts" / "pd-operator"
MISCONFIGURED_TAINT = "pd.serving.dev/e2e-misconfigured"  # test_real_node_seed_examples: a node without uverbs
# The chart's tenancy policy (docs/security.md) widened for what the suite's tests ask for, as an
# administrator who trusts every PDDeployment author would; test_tenancy.py runs the chart's defaults.
SUITE_POLICY: dict[str, Any] = {
    "hostPaths": [{"pathPrefix": "/", "readOnly": False}],
    "serviceAccountNames": ["serving"],
    "tolerationKeys": [
        "amd.com/gpu",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        POOL_KEY,
        MISCONFIGURED_TAINT,
    ],
    "allowPrivileged": True,
    "allowHostNetwork": True,  # test_real_node_seed_examples: the write example's RoCE GIDs
    # test_pod_template: a runtime class and a Multus network of another namespace reach the serving pod
    "runtimeClassNames": ["e2e-rocm"],
    "podAnnotationKeys": ["k8s.v1.cni.cncf.io/networks"],
    "networkNamespaces": ["default"],
}


class Stack:
    """Control plane + real nodes + operator, started and stopped as one."""

    def __init__(self, cp: ControlPlane, detach: bool = False) -> None:
        self.cp = cp
        self.detach = detach

    # ---- nodes ------------------------------------------------------------------------------------------

    def cluster_bridge(self) -> str:
        """The bridge every node of this cluster plugs its pods into: made on first use, removed by down()."""
        name = str(self.cp.extras.get("bridge") or "")
        if not name:
            name = f"pdcl{secrets.token_hex(2)}"
            netns.create_bridge(name)
            self.cp.extras["bridge"] = name
            self.cp.save()
        return name

    def wait_node_ready(self, node: str, ref: ProcRef, timeout_s: float = 90) -> None:
        """Until the Node is Ready and untainted, as long as `ref` (its kubelet) runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not is_running(ref):
                raise RuntimeError(f"{ref.name} exited; see its log")
            with self.cp.http() as client:
                resp = client.get(f"/api/v1/nodes/{node}")
            if resp.status_code == 200 and _schedulable(resp.json()):
                return
            time.sleep(0.3)
        raise TimeoutError(f"node {node} not Ready and untainted after {timeout_s}s")

    # ---- operator ----------------------------------------------------------------------------------------

    def helm(self, *args: str, version: int = 3) -> str:
        binary = self.cp.tool("helm3" if version == 3 else "helm4")
        proc = subprocess.run([binary, *args], env=self.cp.env(), capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def install_operator(
        self,
        helm_version: int = 3,
        values: dict[str, Any] | None = None,
        policy: dict[str, Any] | None = SUITE_POLICY,
        in_cluster: bool | None = None,
    ) -> None:
        """Install the chart. `in_cluster`: the operator runs from its image, as users run it (real nodes);
        else the Deployment is scaled to zero and the operator runs as our process (`start_operator`); None
        keeps how it ran before (an upgrade with other values must not scale the in-cluster operator away).
        ``policy`` widens the chart's tenancy policy (the suite's by default; None: the chart's defaults)."""
        if in_cluster is None:
            in_cluster = bool(self.cp.extras.get("operator_in_cluster", False))
        sets = {} if in_cluster else {"replicaCount": "0"}
        sets |= {k: str(v) for k, v in (values or {}).items()}
        # --reset-values: the chart's defaults and ours, always (given no values at all, helm upgrade would
        # reuse the previous release's, e.g. the suite's widened policy when the test asked the defaults).
        args = [
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            "-n",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--reset-values",
        ]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        if policy is not None:
            widened = self.cp.workdir / "policy-values.yaml"
            widened.write_text(json.dumps({"policy": policy}))  # JSON is YAML
            args += ["--values", str(widened)]
        self.helm(*args, "--wait", "--timeout", "120s", version=helm_version)
        self.cp.extras["operator_in_cluster"] = in_cluster
        self.cp.save()

    def operator_kubeconfig(self) -> Path:
        """Credentials of the chart's ServiceAccount, so the operator runs with exactly the chart's RBAC."""
        account = self.operator_service_account()
        return self.cp.service_account_kubeconfig(OPERATOR_NAMESPACE, account, self.cp.workdir / "operator.kubeconfig")

    def operator_service_account(self) -> str:
        out = self.cp.kubectl("get", "serviceaccounts", "-n", OPERATOR_NAMESPACE, "-o", "json")
        names = [item["metadata"]["name"] for item in json.loads(out)["items"] if item["metadata"]["name"] != "default"]
        if len(names) != 1:
            raise RuntimeError(f"expected one operator ServiceAccount in {OPERATOR_NAMESPACE}, found {names}")
        return str(names[0])

    def operator_deployment(self) -> dict[str, Any]:
        """The chart's one operator Deployment, as stored now."""
        out = self.cp.kubectl("get", "deployments", "-n", OPERATOR_NAMESPACE, "-o", "json")
        deployments = json.loads(out)["items"]
        if len(deployments) != 1:
            raise RuntimeError(f"expected the chart's one operator Deployment, found {len(deployments)}")
        found: dict[str, Any] = deployments[0]
        return found

    def operator_argv(self) -> list[str]:
        """The chart's operator command line, with free ports: the Deployment's args are what we run."""
        container = self.operator_deployment()["spec"]["template"]["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        argv[0] = str(Path(sys.executable).parent / argv[0])  # pdctl of this project's install
        ports: dict[str, object] = {"--liveness-port": self.cp.ports.port(), "--metrics-port": self.cp.ports.port()}
        self.cp.extras["operator_ports"] = {k.strip("-"): v for k, v in ports.items()}
        ports["--policy"] = self.operator_policy_file()  # the chart's ConfigMap, as the Deployment mounts it
        return [f"{a.split('=')[0]}={ports[a.split('=')[0]]}" if a.split("=")[0] in ports else a for a in argv]

    def operator_policy_file(self) -> Path:
        """The chart's tenancy policy ConfigMap written where our operator process reads it."""
        out = self.cp.kubectl("get", "configmaps", "-n", OPERATOR_NAMESPACE, "-o", "json")
        found = [i for i in json.loads(out)["items"] if i["metadata"]["name"].endswith("-policy")]
        if len(found) != 1:
            raise RuntimeError(f"expected the chart's one policy ConfigMap in {OPERATOR_NAMESPACE}, found {len(found)}")
        path = self.cp.workdir / "operator-policy.yaml"
        path.write_text(found[0]["data"]["policy.yaml"])
        return path

    def start_operator(self, name: str = "operator") -> ProcRef:
        """Run the operator as the chart's ServiceAccount, so its RBAC is exactly what is exercised."""
        kubeconfig = self.operator_kubeconfig()
        # POD_ID and POD_NAMESPACE as the chart's Deployment sets them from the downward API.
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "POD_ID": f"{name}-{os.getpid()}",
            "POD_NAMESPACE": OPERATOR_NAMESPACE,
        }
        ref, _ = spawn(name, self.operator_argv(), self.cp.workdir / "logs" / f"{name}.log", env, self.detach)
        self.cp.register(ref)
        log.info("operator running with the token of the chart ServiceAccount (pid %d)", ref.pid)
        return ref

    def stop_operator(self) -> None:
        for ref in [p for p in self.cp.procs if p.name == "operator"]:
            stop(ref, grace_s=20)
            self.cp.procs.remove(ref)
        self.cp.save()

    def restart_operator(self, timeout_s: int = 180) -> None:
        """The operator stopped (SIGTERM, as a rolling update does) and started again: in-cluster a rollout
        restart of its Deployment, waited for until the new pod is available and the old one gone; else our
        process stopped and started."""
        if not self.cp.extras.get("operator_in_cluster"):
            self.stop_operator()
            self.start_operator()
            return
        name = f"deployment/{self.operator_deployment()['metadata']['name']}"
        self.cp.kubectl("rollout", "restart", name, "-n", OPERATOR_NAMESPACE)
        self.cp.kubectl("rollout", "status", name, "-n", OPERATOR_NAMESPACE, f"--timeout={timeout_s}s")

    # ---- external metrics API ------------------------------------------------------------------------------

    def operator_metrics_url(self) -> str:
        """Where the running operator serves /metrics: in-cluster its pod's address and the Deployment's
        metrics port (the machine routes to every node's pod CIDR), else our process's loopback port."""
        if not self.cp.extras.get("operator_in_cluster"):
            return f"http://127.0.0.1:{self.cp.extras['operator_ports']['metrics-port']}/metrics"
        container = self.operator_deployment()["spec"]["template"]["spec"]["containers"][0]
        port = next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == "metrics")
        listing = json.loads(self.cp.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "json"))
        running = [p for p in listing["items"] if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        if len(running) != 1:
            raise RuntimeError(f"expected one running operator pod in {OPERATOR_NAMESPACE}, found {len(running)}")
        return f"http://{running[0]['status']['podIP']}:{port}/metrics"

    @contextlib.contextmanager
    def external_metrics(self) -> Iterator[None]:
        """``e2e.metrics_api`` over the running operator's /metrics, registered with the aggregator (an
        APIService on an ExternalName Service, so the API server dials it on loopback) until Available;
        removed afterwards, APIService first (an unavailable aggregated API fails every discovery)."""
        name, port = "pd-external-metrics", self.cp.ports.port()
        certs = self.cp.workdir / "pki"
        cert, key = pki_mod.self_signed_serving_cert(certs, f"{name}.{OPERATOR_NAMESPACE}.svc", ["127.0.0.1"])
        argv = [
            sys.executable,
            "-m",
            "e2e.metrics_api",
            f"--metrics-url={self.operator_metrics_url()}",
            f"--port={port}",
            f"--cert={cert}",
            f"--key={key}",
            f"--client-ca={self.cp.ca_file}",
        ]
        env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
        ref, _ = spawn(name, argv, self.cp.workdir / "logs" / f"{name}.log", env, self.detach)
        self.cp.register(ref)
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        }
        api = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": EXTERNAL_METRICS},
            "spec": {
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "service": {"namespace": OPERATOR_NAMESPACE, "name": name, "port": port},
                "caBundle": base64.b64encode(cert.read_bytes()).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }
        try:
            for obj in (service, api):
                self.cp.kubectl("apply", "-f", "-", input_text=json.dumps(obj))
            self.cp.kubectl("wait", f"apiservice/{EXTERNAL_METRICS}", "--for=condition=Available", "--timeout=90s")
            log.info("external metrics API Available (pid %d, port %d)", ref.pid, port)
            yield
        finally:
            self.cp.kubectl("delete", "apiservice", EXTERNAL_METRICS, "--ignore-not-found", check=False)
            self.cp.kubectl("delete", "service", name, "-n", OPERATOR_NAMESPACE, "--ignore-not-found", check=False)
            stop(ref, grace_s=10)
            self.cp.procs.remove(ref)
            self.cp.save()

    # ---- all -----------------------------------------------------------------------------------------------

    # ---- real nodes --------------------------------------------------------------------------------------

    def start_real_control_plane(self) -> None:
        """The control plane of a cluster of real nodes: the API server listens on the cluster bridge's address
        on the node network (a /24 of its own), which the nodes' namespaces and, through the kubernetes
        Service, their pods reach."""
        self.cp.workdir.mkdir(parents=True, exist_ok=True)
        bridge = self.cluster_bridge()
        subnet = netns.choose_subnet()
        gateway = next(subnet.hosts())
        subprocess.run(["ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", bridge], check=True)
        self.cp.extras["node_network"] = {"subnet": str(subnet), "nodes": 0}
        self.cp.address = str(gateway)
        self.cp.start(detach=self.detach)
        real_node.node_rbac(self.cp)

    def start_real_node(
        self,
        node: str = NODE_NAME,
        images: list[NodeImage] | None = None,
        labels: dict[str, str] | None = None,
        taints: tuple[str, ...] = (),
        plugins: dict[str, NodePlugin] | None = None,
        shape: MachineShape | None = None,
    ) -> RealNode:
        """A node of the cluster (after `start_real_control_plane`), Ready, its pods routed and its DNS
        answering. `images` default to the pause, operator and runtime images (real_node.node_images);
        `plugins` start in the node (device plugins, DRA drivers) once its kubelet runs; `shape` is the
        host its kubelet sees (its cpu and memory capacity), this machine's when None."""
        network = self.cp.extras["node_network"]
        subnet = ipaddress.IPv4Network(network["subnet"])
        network["nodes"] += 1
        run_id = secrets.token_hex(2)
        layout = NodeLayout(
            name=node,
            run_id=run_id,
            root=str(real_node.node_root(run_id)),
            node_ip=str(list(subnet.hosts())[network["nodes"]]),
            gateway=str(next(subnet.hosts())),
            prefix=subnet.prefixlen,
            bridge=self.cluster_bridge(),
            cgroup_parent=real_node.own_memory_cgroup(),
        )
        started = time.monotonic()
        manifest = real_node.ImageManifest.load()
        node_images = images if images is not None else manifest.node_images()
        machine = RealNode(self.cp, layout, self.detach)
        machine.start(node_images, manifest.role("pause"), labels, taints, plugins, shape)
        layout = machine.layout = dataclasses.replace(layout, pod_cidr=machine.wait_pod_cidr())
        self.cp.extras["real_nodes"][node]["layout"] = layout.as_dict()
        self.cp.save()
        real_node.route_pods(self.real_node_layouts())
        kubelet = next(p for p in self.cp.procs if p.name == real_node.proc_name("kubelet", node))
        self.wait_node_ready(node, kubelet)
        real_node.wait_dns_ready(layout)
        took = time.monotonic() - started
        log.info("real node %s Ready in %.1fs (%s, pods %s)", node, took, layout.node_ip, layout.pod_cidr)
        return machine

    def start_real_pool(self, pool: str, count: int, plugins: dict[str, NodePlugin] | None = None) -> list[str]:
        """Real nodes `<pool>-0..<count-1>` with the pool's label and NoSchedule taint, each started (one
        after another) unless it runs already (a node torn down is started again); they hold the pause and
        runtime images (serving pods, not the operator) and run `plugins` (start_real_node)."""
        images = real_node.ImageManifest.load().node_images(("pause", "runtime"))
        nodes = [f"{pool}-{i}" for i in range(count)]
        for node in nodes:
            if node not in self.cp.extras.get("real_nodes", {}):
                self.start_real_node(node, images, {POOL_KEY: pool}, (f"{POOL_KEY}={pool}:NoSchedule",), plugins)
        return nodes

    def remove_real_node(self, node: str) -> NodeLayout:
        """Tear a real node down (real_node.teardown) and delete its Node; returns its layout, for a test
        that checks nothing of it stayed (real_node.leftovers)."""
        state = self.cp.extras["real_nodes"][node]
        real_node.teardown(self.cp, state)
        self.cp.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
        return NodeLayout.from_dict(state["layout"])

    def fail_node(self, node: str) -> None:
        """The "node dies" fault on a real node: everything of it killed at once, its link down
        (real_node.power_off); its Node is left to the node lifecycle controller."""
        real_node.power_off(self.cp, NodeLayout.from_dict(self.cp.extras["real_nodes"][node]["layout"]))

    def real_node_layouts(self) -> list[NodeLayout]:
        return [NodeLayout.from_dict(s["layout"]) for s in self.cp.extras.get("real_nodes", {}).values()]

    # ---- all -----------------------------------------------------------------------------------------------

    def up(self, operator: bool = True, node: bool = True) -> None:
        """Control plane, one real node and the operator in-cluster. The node is shaped as the MI300X server
        it is named after: several simulated deployments and their probe Jobs ask more CPU than this
        machine's 2 cores (docs/e2e-real-node.md, "A GPU server's shape")."""
        self.start_real_control_plane()
        if node:
            self.start_real_node(shape=MI300X_SERVER)
        if operator:
            self.install_operator(in_cluster=True)

    def down(self, remove: bool = True) -> None:
        """Tear the real nodes down, stop every other process (newest first), remove the bridge and the files."""
        for state in list(self.cp.extras.get("real_nodes", {}).values()):
            real_node.teardown(self.cp, state)
        self.cp.stop(remove=False)
        if bridge := self.cp.extras.pop("bridge", None):
            netns.delete_bridge(str(bridge))
            self.cp.save()
        if remove:
            self.cp.stop(remove=True)


def pool_placement(pool: str) -> dict[str, Any]:
    """`spec.node` of a PDDeployment (or the placement of a pod spec) that lands on a node of `pool`."""
    toleration = {"key": POOL_KEY, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    return {"nodeSelector": {POOL_KEY: pool}, "tolerations": [toleration]}


def _schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller's own taints (not-ready, unreachable) are gone."""
    conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
    taints = node.get("spec", {}).get("taints") or []
    lifecycle = [t for t in taints if str(t.get("key", "")).startswith("node.kubernetes.io/")]
    return conditions.get("Ready") == "True" and not lifecycle
