"""A node agent that plays the kubelet for one fake AMD MI300X node, running pods as local processes.

It registers a Node with the capacity and labels of an 8-GPU MI300X node with RDMA NICs (GPUs and NICs
advertised as their device plugins do), keeps its Lease and Ready condition fresh, and for every pod
bound to it runs the exact container commands of the pod spec (see pod_worker.py), each pod in its own
network namespace and each container with its own /dev holding the devices the emulated plugins
allocated to it (devices.py). hostNetwork pods share the node's host network namespace, which is not
the machine's (netns.py). It also stands in for cluster DNS (per-pod hosts files with Service names,
cluster_names.py) and serves `kubectl logs` through a kubelet-style HTTPS endpoint.

Several agents make a cluster of several nodes: with `--bridge` and `--cluster-cidr` each plugs its
pods into the cluster's bridge inside the pod CIDR the controller-manager gave its Node, so pods on
different nodes reach each other. Node loss is no fault of the agent's: a real node is powered off instead
(`real_node.power_off`, docs/e2e-real-node.md).

`--status-only` runs no processes: pods just become Running and Ready (for the operator benchmark).

    python -m e2e.node_agent --kubeconfig admin.kubeconfig --state-dir /tmp/agent [--status-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import signal
import socket
import ssl
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from e2e import devices, pki, podspec
from e2e.cluster_names import ClusterNames
from e2e.kubeapi import MERGE, ApiError, KubeClient
from e2e.netns import PodNetwork
from e2e.pod_worker import NodeContext, PodWorker, now_iso
from e2e.podspec import Obj
from e2e.sandbox import MountPoints

log = logging.getLogger(__name__)

KUBELET_VERSION = "v1.36.3"
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10
HEARTBEAT_S = 30
SHUTDOWN_GRACE_S = 3.0
POD_CIDR_WAIT_S = 60.0
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

VLLM_SHIM = Path(__file__).with_name("shims") / "vllm"


def mi300x_labels(name: str) -> dict[str, str]:
    """Labels of an MI300X node as the AMD node labeller and NFD publish them (amd-gpu-pod.md §1.2)."""
    gpu = {
        "device-id": "74a1",
        "product-name": "AMD_Instinct_MI300X_OAM",
        "family": "AI",
        "vram": "192G",
        "cu-count": "304",
        "simd-count": "1216",
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "mi300x-8gpu",
        "feature.node.kubernetes.io/amd-gpu": "true",
        "amd.com/gpu.compute-memory-partition": "spx_nps1",
        "amd.com/gpu.compute-partitioning-supported": "true",
        "amd.com/gpu.memory-partitioning-supported": "true",
        "pd.serving.dev/e2e-node": "true",
    }
    for prop, value in gpu.items():
        labels[f"amd.com/gpu.{prop}"] = value
        labels[f"beta.amd.com/gpu.{prop}"] = value
    return labels


def node_status(ip: str, kubelet_port: int, device_capacity: dict[str, str], extra: dict[str, str]) -> Obj:
    capacity = {"cpu": "192", "memory": "2113638Mi", "pods": "110", "ephemeral-storage": "3Ti"}
    capacity |= {"hugepages-1Gi": "0", "hugepages-2Mi": "0", **device_capacity, **extra}
    allocatable = {**capacity, "cpu": "190", "memory": "2047000Mi"}
    stamp = now_iso()
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "pd-e2e node agent",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind, status, reason in conditions
        ],
        "addresses": [{"type": "InternalIP", "address": ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": "pd-e2e",
            "systemUUID": "pd-e2e",
            "bootID": "pd-e2e",
            "kernelVersion": os.uname().release,
            "osImage": "pd-e2e node agent",
            "containerRuntimeVersion": "pd-e2e://0.1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def parse_taint(text: str) -> Obj:
    """`key=value:Effect` (or `key:Effect`), the kubelet's --register-with-taints format."""
    rest, _, effect = text.rpartition(":")
    key, _, value = rest.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise argparse.ArgumentTypeError(f"bad taint {text!r}: expected key=value:Effect")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not key or not sep:
        raise argparse.ArgumentTypeError(f"bad label {text!r}: expected key=value")
    return key, value


def micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """Registers the node and keeps one PodWorker per pod bound to it."""

    def __init__(self, api: KubeClient, args: argparse.Namespace) -> None:
        self.api = api
        self.name: str = args.node_name
        self.state_dir: Path = args.state_dir.resolve()
        self.status_only: bool = args.status_only
        self.args = args
        self.network = None if args.status_only else PodNetwork(bridge=args.bridge, cluster_cidr=args.cluster_cidr)
        self.node_devices = devices.NodeDevices(
            root=self.state_dir / "node-root", gpus=args.gpus, nics=args.nics, uverbs_loaded=not args.no_uverbs
        )
        self.mount_points = MountPoints()
        self.workers: dict[str, PodWorker] = {}
        self.finalized: set[str] = set()
        self.names = ClusterNames(api)
        self.node_uid = ""
        self._running: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.ctx: NodeContext | None = None
        self._kubelet_port = 0

    # ---- startup -----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self._create_node()
        host_ip = "127.0.0.1"
        if self.network is not None:
            await self.network.setup(await self._pod_cidr() if self.args.bridge else None)
            host_ip = self.network.node_ip
        devices.create_node_root(self.node_devices)
        self._write_state()
        self.ctx = NodeContext(
            api=self.api,
            node_name=self.name,
            host_ip=host_ip,
            pods_dir=self.state_dir / "pods",
            node_devices=self.node_devices,
            device_manager=devices.DeviceManager(self.node_devices),
            mount_points=self.mount_points,
            base_env=self._base_env(),
            network=self.network,
            status_only=self.status_only,
            backoff_base_s=self.args.backoff_base,
            backoff_max_s=self.args.backoff_max,
            keep_files=self.args.keep_files,
            on_network_change=self._write_hosts_files,
            post_event=self.post_event,
        )
        runner = await self._start_log_server(host_ip)
        relay = await self._start_api_relay()
        try:
            await self.api.patch(f"/api/v1/nodes/{self.name}/status", {"status": self._node_status(host_ip)})
            tasks = [
                self._lease_loop(),
                self._heartbeat_loop(host_ip),
                self._watch_pods(),
                self.names.watch_services(),
                self.names.watch_endpoint_slices(),
                self._hosts_loop(),
            ]
            self._running = [asyncio.create_task(t) for t in tasks]
            log.info("node %s ready (status-only=%s)", self.name, self.status_only)
            await stop.wait()
            await self._cancel_running()
        finally:
            if relay is not None:
                relay.close()
            await self._shutdown(runner)

    async def _start_api_relay(self) -> asyncio.Server | None:
        """kube-proxy's part for the `kubernetes` Service: pods reach the API server (on the machine's
        loopback) at the node's IP, port 443, which their hosts file names kubernetes.default.svc (a name
        in the serving certificate), so in-cluster clients work as written."""
        if self.network is None:
            return None
        api = urllib.parse.urlsplit(self.api.server)
        host, port = api.hostname or "127.0.0.1", api.port or 443

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        return await asyncio.start_server(relay, sock=self.network.listening_socket(443))

    def _write_state(self) -> None:
        state = {"pid": os.getpid(), "node": self.name}
        if self.network is not None:
            state |= {"run_id": self.network.run_id, "bridge": self.network.bridge}
            state |= {"node_netns": self.network.node_netns, "node_ip": self.network.node_ip}
            state |= {"pod_cidr": str(self.network.subnet)}
        (self.state_dir / "agent.json").write_text(json.dumps(state))

    def _base_env(self) -> dict[str, str]:
        """PATH maps the runtime image's executables to this project's install: `pdctl` and `python` from
        the venv, `vllm` to a shim that serves with the simulated engine. The directories are outside the
        agent's state, and no volume may hide them (sandbox.py refuses such mounts), so lookups work after
        any mount."""
        env = {"HOME": "/root", "LANG": "C.UTF-8"}
        return {"PATH": f"{VLLM_SHIM.parent}:{Path(sys.executable).parent}:{SYSTEM_PATH}", **env}

    async def _create_node(self) -> None:
        """Register the Node (its status follows once the network is up, as the kubelet's first update)."""
        labels = mi300x_labels(self.name) | dict(self.args.node_label)
        node: Obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels}}
        if self.args.register_with_taint:
            node["spec"] = {"taints": self.args.register_with_taint}
        try:
            created = await self.api.create("/api/v1/nodes", node)
        except ApiError as err:
            if err.status != 409:
                raise
            created = await self.api.patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": labels}})
        self.node_uid = created["metadata"]["uid"]

    async def _pod_cidr(self) -> ipaddress.IPv4Network:
        """The node's spec.podCIDR, which the controller-manager's node IPAM sets soon after registration."""
        deadline = asyncio.get_running_loop().time() + POD_CIDR_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            node = await self.api.get(f"/api/v1/nodes/{self.name}")
            if cidr := node.get("spec", {}).get("podCIDR"):
                log.info("node %s has pod CIDR %s", self.name, cidr)
                return ipaddress.IPv4Network(cidr)
            await asyncio.sleep(0.2)
        raise RuntimeError(
            f"node {self.name} got no spec.podCIDR in {POD_CIDR_WAIT_S:.0f}s: "
            "is kube-controller-manager running with --allocate-node-cidrs?"
        )

    def _node_status(self, host_ip: str) -> Obj:
        extra = dict(item.split("=", 1) for item in self.args.extra_resource)
        return node_status(host_ip, self._kubelet_port, self.node_devices.capacity(), extra)

    # ---- node liveness -----------------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.node_uid}
        while True:
            spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": micro_now()}
            try:
                try:
                    await self.api.patch(path, {"spec": spec}, MERGE)
                except ApiError as err:
                    if err.status != 404:
                        raise
                    meta = {"name": self.name, "namespace": "kube-node-lease", "ownerReferences": [owner]}
                    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
                    await self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)
            except Exception as err:
                log.warning("lease renewal failed: %s", err)
            await asyncio.sleep(LEASE_RENEW_S)

    async def _heartbeat_loop(self, host_ip: str) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.api.patch(f"/api/v1/nodes/{self.name}/status", {"status": self._node_status(host_ip)})
            except Exception as err:
                log.warning("node status heartbeat failed: %s", err)

    async def _cancel_running(self) -> None:
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running = []

    # ---- pods ----------------------------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        params = {"fieldSelector": f"spec.nodeName={self.name}"}
        async for kind, pod in self.api.watch("/api/v1/pods", params):
            if kind == "SYNCED":
                listed = {item["metadata"]["uid"] for item in pod.get("items", [])}
                for uid in set(self.workers) - listed:
                    self._spawn(self._retire(self.workers[uid], gone=True))
                continue
            self._on_pod(kind, pod)

    def _on_pod(self, kind: str, pod: Obj) -> None:
        assert self.ctx is not None
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        deleting = bool(pod["metadata"].get("deletionTimestamp"))
        if kind == "DELETED":
            if worker is not None:
                self._spawn(self._retire(worker, gone=True))
            self.finalized.discard(uid)
            return
        if worker is None:
            if deleting and uid not in self.finalized:
                self.finalized.add(uid)
                self._spawn(self._finalize(pod))
            elif not deleting and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                worker = PodWorker(self.ctx, pod)
                self.workers[uid] = worker
                worker.start()
            return
        worker.update(pod)
        if deleting and not worker.stopping:
            self._spawn(self._retire(worker, gone=False))

    async def _retire(self, worker: PodWorker, gone: bool) -> None:
        """Stop the pod's containers; unless the object is already gone, finalize its deletion."""
        await worker.stop(grace_s=2.0 if gone else None)
        self.workers.pop(worker.uid, None)
        if not gone:
            self.finalized.add(worker.uid)
            await self._finalize(worker.pod)

    async def _finalize(self, pod: Obj) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            await self.api.delete(path, body)
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("finalizing pod %s/%s failed: %s", meta["namespace"], meta["name"], err)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- services and names --------------------------------------------------------------------------------

    async def _hosts_loop(self) -> None:
        while True:
            await self.names.changed.wait()
            await asyncio.sleep(0.05)
            self.names.changed.clear()
            self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        live = [w for w in self.workers.values() if w.sandbox_ready and w.sandbox.netns]
        addresses = [self._address(w) for w in live]
        targets = self.names.targets(addresses)
        if self.network is not None:
            targets[("default", "kubernetes")] = self.network.node_ip  # _start_api_relay
        for worker, address in zip(live, addresses, strict=True):
            hostname = worker.pod["spec"].get("hostname", worker.name)
            worker.sandbox.write_hosts(podspec.render_hosts(address, hostname, targets))

    @staticmethod
    def _address(worker: PodWorker) -> podspec.PodAddress:
        labels = worker.pod["metadata"].get("labels") or {}
        return podspec.PodAddress(worker.namespace, worker.name, labels, worker.pod_ip)

    # ---- events ---------------------------------------------------------------------------------------------

    async def post_event(self, pod: Obj, reason: str, message: str, kind: str, field_path: str) -> None:
        meta = pod["metadata"]
        stamp = now_iso()
        involved = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"]}
        involved["uid"] = meta["uid"]
        if field_path:
            involved["fieldPath"] = field_path
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.name,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.create(f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except Exception as err:
            log.debug("event %s for %s not recorded: %s", reason, meta["name"], err)

    # ---- kubectl logs ------------------------------------------------------------------------------------

    async def _start_log_server(self, host_ip: str) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        cert, key = pki.self_signed_serving_cert(self.state_dir, "pd-e2e-kubelet", [host_ip])
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        if self.args.client_ca:
            ctx.load_verify_locations(cafile=str(self.args.client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server (kubelet client cert) may read logs
        if self.network is not None:
            sock = self.network.listening_socket()  # in the node's host network, as a kubelet listens
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host_ip, 0))
        self._kubelet_port = int(sock.getsockname()[1])
        await web.SockSite(runner, sock, ssl_context=ctx).start()
        return runner

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        ns, name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        workers = [w for w in self.workers.values() if (w.namespace, w.name) == (ns, name)]
        if not workers:
            raise web.HTTPNotFound(text=f"pod {ns}/{name} is not running on {self.name}")
        directory = workers[0].sandbox.root / "containers" / container
        previous = request.query.get("previous") == "true"
        path = directory / ("previous.log" if previous else "current.log")
        if not path.exists():
            raise web.HTTPNotFound(text=f"no logs for container {container}")
        lines = path.read_bytes().splitlines(keepends=True)
        if tail := request.query.get("tailLines"):
            lines = lines[-int(tail) :]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(b"".join(lines))
        if request.query.get("follow") == "true" and not previous:
            await self._follow(path, response, lambda: not workers[0].stopping)
        return response

    @staticmethod
    async def _follow(path: Path, response: web.StreamResponse, alive: Callable[[], bool]) -> None:
        offset = path.stat().st_size
        while alive() and path.exists():
            size = path.stat().st_size
            if size > offset:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    await response.write(handle.read())
                offset = size
            await asyncio.sleep(0.5)

    # ---- shutdown ------------------------------------------------------------------------------------------

    async def _shutdown(self, runner: web.AppRunner) -> None:
        """Stop every pod's processes (the pod objects stay), then remove namespaces, bridge and mounts."""
        await asyncio.gather(
            *(w.stop(grace_s=SHUTDOWN_GRACE_S) for w in list(self.workers.values())), return_exceptions=True
        )
        for task in list(self._background):
            task.cancel()
        if self.network is not None:
            await self.network.teardown()
        self.mount_points.cleanup()
        await runner.cleanup()
        await self.api.close()
        log.info("node agent %s stopped and cleaned up", self.name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m e2e.node_agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True, help="pod sandboxes, logs and agent.json")
    parser.add_argument("--node-name", default="mi300x-0")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs (amd.com/gpu) of the node")
    parser.add_argument(
        "--nics",
        type=int,
        default=8,
        help=f"RDMA NICs, advertised as {devices.NIC_RESOURCE} and shared as {devices.SHARED_RDMA_RESOURCE}",
    )
    parser.add_argument(
        "--no-uverbs",
        action="store_true",
        help="a misconfigured node: ib_uverbs not loaded, so the RDMA plugins advertise their resources but "
        "no /dev/infiniband/uverbs* exists",
    )
    parser.add_argument(
        "--register-with-taint",
        action="append",
        type=parse_taint,
        default=[],
        metavar="KEY=VALUE:EFFECT",
        help="a taint the node registers with (the kubelet's --register-with-taints)",
    )
    parser.add_argument(
        "--node-label",
        action="append",
        type=parse_label,
        default=[],
        metavar="KEY=VALUE",
        help="a label the node registers with, beside the MI300X ones (the kubelet's --node-labels)",
    )
    parser.add_argument(
        "--bridge",
        help="join the cluster's pod network on this existing bridge, in the node's spec.podCIDR "
        "(needs --cluster-cidr); without it the agent makes a private bridge and picks a free /24",
    )
    parser.add_argument(
        "--cluster-cidr",
        type=ipaddress.IPv4Network,
        help="the cluster's pod CIDR (kube-controller-manager --cluster-cidr): routed to the other nodes' pods",
    )
    parser.add_argument(
        "--extra-resource", action="append", default=[], metavar="NAME=QTY", help="more extended resources"
    )
    parser.add_argument("--status-only", action="store_true", help="run no processes; pods become Ready at once")
    parser.add_argument("--client-ca", type=Path, help="CA of the API server's kubelet client certificate")
    parser.add_argument("--backoff-base", type=float, default=1.0, help="first restart back-off (kubelet: 10s)")
    parser.add_argument("--backoff-max", type=float, default=20.0, help="back-off cap (kubelet: 300s)")
    parser.add_argument("--keep-files", action="store_true", help="keep pod directories (logs) after deletion")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if bool(args.bridge) != bool(args.cluster_cidr):
        parser.error("--bridge and --cluster-cidr go together")
    return args


async def amain(args: argparse.Namespace) -> None:
    api = KubeClient.from_kubeconfig(args.kubeconfig, user_agent=f"pd-e2e-node-agent/{args.node_name}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agent = NodeAgent(api, args)
    await agent.run(stop)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction of a relayed connection until either side closes."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
