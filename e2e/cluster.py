"""A real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The API server listens on 127.0.0.1, or, for a cluster of real nodes, on the cluster bridge's address
that the nodes' network namespaces and their pods reach (`address`); the rest stays on 127.0.0.1.

Used as a pytest session fixture, and under the stack (e2e/stack.py) that `make demo` and `make cluster-up`
start (e2e/demo.py, e2e/cluster_cli.py). Every process is recorded (pid and start time) in a state file
in the cluster's work directory, so `down` stops exactly what `up` started.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e import netns
from e2e import pki as pki_mod
from e2e.procs import ProcRef, spawn, stop
from pd_runtime.localports import PortReservation

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "build-control-plane.sh"
DEFAULT_STATE_DIR = Path(os.environ.get("PD_E2E_STATE_DIR", "/tmp/pd-operator-e2e/cluster"))
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_CIDR_PREFIX = 20  # 16 nodes of /24 each (--node-cidr-mask-size)


def binaries_dir(*components: str) -> Path:
    """The directory with etcd, kube-*, kubectl and helm: $PD_E2E_BIN, or built/reused by the build script;
    `components` asks for more ("--node": kubelet, kube-proxy, CoreDNS; "--kwok")."""
    if env_bin := os.environ.get("PD_E2E_BIN"):
        return Path(env_bin)
    argv = ["bash", str(BUILD_SCRIPT), *components]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return Path(out.splitlines()[-1])


@dataclass
class ControlPlane:
    """One running control plane and everything needed to reach and stop it."""

    workdir: Path
    bin_dir: Path
    api_port: int = 0
    admin_token: str = ""
    cluster_cidr: str = ""  # pods of all nodes; each node gets a /24 of it as spec.podCIDR
    address: str = "127.0.0.1"  # where the API server listens and what it advertises (kubernetes Service)
    procs: list[ProcRef] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    audit_groups: list[str] = field(default_factory=list)  # audit requests of these groups (benchmarks)
    ports: PortReservation = field(default_factory=PortReservation, repr=False, compare=False)
    """The components' ports, held for as long as this process runs (the components join them)."""

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/kopf subprocesses that talk to this cluster as admin."""
        path = f"{self.bin_dir}:{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def save(self) -> None:
        state = {
            "workdir": str(self.workdir),
            "bin_dir": str(self.bin_dir),
            "api_port": self.api_port,
            "admin_token": self.admin_token,
            "cluster_cidr": self.cluster_cidr,
            "address": self.address,
            "procs": [p.as_dict() for p in self.procs],
            "extras": self.extras,
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, workdir: Path) -> ControlPlane:
        state = json.loads((workdir / "state.json").read_text())
        return cls(
            workdir=Path(state["workdir"]),
            bin_dir=Path(state["bin_dir"]),
            api_port=state["api_port"],
            admin_token=state["admin_token"],
            cluster_cidr=state.get("cluster_cidr", ""),
            address=state.get("address", "127.0.0.1"),
            procs=[ProcRef.from_dict(p) for p in state["procs"]],
            extras=state.get("extras", {}),
        )

    def http(self, token: str | None = None) -> httpx.Client:
        """A synchronous client for the API server (admin unless `token` is given)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.server, verify=ctx, headers=headers, timeout=30)

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        """Run kubectl as admin; returns stdout (stderr is included in the error on failure)."""
        proc = subprocess.run(
            [self.tool("kubectl"), *args],
            env=self.env(),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def register(self, ref: ProcRef) -> None:
        self.procs.append(ref)
        self.save()

    # ---- startup -----------------------------------------------------------------------------------

    def start(self, detach: bool = False) -> None:
        """Start all four components and wait until the cluster accepts pods."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        material = pki_mod.generate(self.workdir / "pki", [self.address])
        self.admin_token = material.admin_token
        self.api_port = self.ports.port()
        self.cluster_cidr = str(netns.choose_subnet(CLUSTER_CIDR_PREFIX))
        self.save()
        etcd_url = self._start_etcd(detach)
        self._start_apiserver(material, etcd_url, detach)
        self._write_kubeconfig(self.kubeconfig, self.admin_token, "pd-e2e-admin")
        self._start_controller_manager(material, detach)
        self._start_scheduler(detach)
        self._wait_for_default_service_account()
        log.info("control plane ready at %s (kubeconfig %s)", self.server, self.kubeconfig)

    def _spawn(self, name: str, argv: list[str], detach: bool) -> None:
        ref, _ = spawn(name, argv, self.workdir / "logs" / f"{name}.log", detach=detach)
        self.register(ref)

    def _start_etcd(self, detach: bool) -> str:
        client, peer = self.ports.port(), self.ports.port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        argv = [
            self.tool("etcd"),
            "--name=pd-e2e",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=pd-e2e={peer_url}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--log-level=warn",
        ]
        self._spawn("etcd", argv, detach)
        _wait_until(lambda: _http_ok(f"{client_url}/health"), 60, "etcd /health")
        return client_url

    def _start_apiserver(self, material: pki_mod.Pki, etcd_url: str, detach: bool) -> None:
        argv = [
            self.tool("kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            # logs, exec, port-forward: the API server dials a real node's kubelet at its InternalIP
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--secure-port={self.api_port}",
            f"--cert-dir={self.workdir / 'pki'}",
            f"--tls-cert-file={material.server_cert}",
            f"--tls-private-key-file={material.server_key}",
            f"--client-ca-file={material.ca_cert}",
            f"--token-auth-file={material.token_file}",
            f"--kubelet-client-certificate={material.kubelet_client_cert}",
            f"--kubelet-client-key={material.kubelet_client_key}",
            "--authorization-mode=Node,RBAC",
            # As hardened clusters (and OpenShift) run it: blockOwnerDeletion needs update on the owner's finalizers.
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={material.sa_public}",
            f"--service-account-signing-key-file={material.sa_private}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=1h",
            # API aggregation (extension API servers such as the suite's external metrics API): the
            # aggregator proxies with this client certificate and the requestheader identity headers.
            f"--proxy-client-cert-file={material.proxy_client_cert}",
            f"--proxy-client-key-file={material.proxy_client_key}",
            f"--requestheader-client-ca-file={material.ca_cert}",
            f"--requestheader-allowed-names={pki_mod.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        ]
        self._spawn("kube-apiserver", argv + self._audit_args(), detach)
        _wait_until(self._apiserver_ready, 120, "kube-apiserver /readyz")

    def _audit_args(self) -> list[str]:
        """Metadata-level audit of the given groups only: one JSON line per request, for counting."""
        if not self.audit_groups:
            return []
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": self.audit_groups}, {"level": "None"}],
        }
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return [f"--audit-policy-file={path}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json"]

    def _apiserver_ready(self) -> bool:
        try:
            with self.http() as client:
                return client.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _component_args(self, port: int) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _start_controller_manager(self, material: pki_mod.Pki, detach: bool) -> None:
        argv = [
            self.tool("kube-controller-manager"),
            *self._component_args(self.ports.port()),
            f"--root-ca-file={material.ca_cert}",
            f"--service-account-private-key-file={material.sa_private}",
            "--use-service-account-credentials=true",
            "--concurrent-gc-syncs=10",
            "--allocate-node-cidrs=true",  # node IPAM: each node's spec.podCIDR, as on a kubenet-style cluster
            f"--cluster-cidr={self.cluster_cidr}",
            "--node-cidr-mask-size=24",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--horizontal-pod-autoscaler-sync-period=5s",  # the HPA controller (default 15s), for test_hpa
        ]
        self._spawn("kube-controller-manager", argv, detach)

    def _start_scheduler(self, detach: bool) -> None:
        self._spawn("kube-scheduler", [self.tool("kube-scheduler"), *self._component_args(self.ports.port())], detach)

    def _wait_for_default_service_account(self) -> None:
        def ready() -> bool:
            with self.http() as client:
                sa = client.get("/api/v1/namespaces/default/serviceaccounts/default")
                ca = client.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
                return sa.status_code == 200 and ca.status_code == 200

        _wait_until(ready, 120, "default ServiceAccount (kube-controller-manager)")

    def _write_kubeconfig(self, path: Path, token: str, user: str) -> None:
        path.write_text(yaml.safe_dump(kubeconfig_dict(self.server, self.ca_file, token, user)))
        path.chmod(0o600)

    # ---- credentials ---------------------------------------------------------------------------------

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, expiration_s: int = 24 * 3600) -> Path:
        """Mint a token for a ServiceAccount (TokenRequest) and write a kubeconfig that uses it."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        body["spec"] = {"expirationSeconds": expiration_s}  # type: ignore[assignment]
        with self.http() as client:
            resp = client.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=body)
            resp.raise_for_status()
            token = resp.json()["status"]["token"]
        user = f"system:serviceaccount:{namespace}:{name}"
        path.write_text(yaml.safe_dump(kubeconfig_dict(self.server, self.ca_file, token, user)))
        path.chmod(0o600)
        return path

    # ---- teardown ------------------------------------------------------------------------------------

    def stop(self, remove: bool = True) -> None:
        """Stop every recorded process, newest first (agent and operator before etcd), then remove files."""
        for ref in reversed(self.procs):
            stop(ref, grace_s=15.0)
        self.procs.clear()
        if remove:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            self.save()


def kubeconfig_dict(server: str, ca_file: Path, token: str, user: str) -> dict[str, Any]:
    ca_data = base64.b64encode(ca_file.read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "pd-e2e", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "pd-e2e", "context": {"cluster": "pd-e2e", "user": user}}],
        "current-context": "pd-e2e",
    }


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def new_workdir(prefix: str = "pd-e2e-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
