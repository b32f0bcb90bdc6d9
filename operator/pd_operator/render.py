"""Pure: a validated spec -> every Kubernetes object the operator creates for it.

Why a bare Pod and not a one-replica Deployment (with Recreate): the pod holds every GPU of the node,
so no surge is possible and a rollout must be delete-then-create anyway; the operator needs the exact
pod (one name, its containerStatuses) to report per-role readiness and GPU assignment, and it already
watches it, so a ReplicaSet controller in between would add a second owner of the same decision and
one more RBAC grant (apps/deployments) without adding behaviour. The operator recreates a deleted pod
and rolls it when the rendered spec changes (``pd.serving.dev/spec-hash``).

No ConfigMap is rendered: every setting travels in the containers' command lines and env, so
``kubectl get pod -o yaml`` shows exactly what runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_operator import api
from pd_operator.api import PDDeploymentSpec
from pd_operator.engine_cmd import (
    TERMINATION_LOG,
    EngineContainer,
    bench_command,
    bench_env,
    engine_command,
    engine_containers,
    engine_env,
    proxy_command,
    proxy_env,
)

Obj = dict[str, Any]

LABEL_DEPLOYMENT = f"{api.GROUP}/deployment"
LABEL_COMPONENT = "app.kubernetes.io/component"
ANNOTATION_SPEC_HASH = f"{api.GROUP}/spec-hash"
ANNOTATION_GENERATION = f"{api.GROUP}/generation"
COMPONENT_SERVING = "serving"
COMPONENT_PROBE = "goodput-probe"
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "pd-operator"}
DRA_CLAIM = "gpus"
PROXY_CONTAINER = "proxy"
BENCH_CONTAINER = "bench"


@dataclass(frozen=True)
class Owner:
    """The PDDeployment the objects belong to; ``uid`` is empty when rendering a file offline."""

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0


# ---- names and metadata --------------------------------------------------------------------------


def pod_name(owner: Owner) -> str:
    return owner.name


def service_name(owner: Owner) -> str:
    return owner.name


def claim_template_name(owner: Owner) -> str:
    return f"{owner.name}-gpus"


def service_url(owner: Owner, spec: PDDeploymentSpec) -> str:
    return f"http://{service_name(owner)}.{owner.namespace}.svc:{spec.proxy.port}"


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pddeployment",
        "app.kubernetes.io/instance": owner.name,
        LABEL_COMPONENT: component,
        "app.kubernetes.io/managed-by": "pd-operator",
        "app.kubernetes.io/part-of": "pd-serving",
        LABEL_DEPLOYMENT: owner.name,
    }


def serving_selector(owner: Owner) -> dict[str, str]:
    return {LABEL_DEPLOYMENT: owner.name, LABEL_COMPONENT: COMPONENT_SERVING}


def _metadata(owner: Owner, name: str, component: str) -> Obj:
    meta: Obj = {"name": name, "namespace": owner.namespace, "labels": labels(owner, component)}
    if owner.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


# ---- GPUs -------------------------------------------------------------------------------------------


def _reserves_gpus(spec: PDDeploymentSpec) -> bool:
    return spec.engine == "vllm" or spec.simulation.reserve_gpus


def _uses_nic_resource(spec: PDDeploymentSpec) -> bool:
    kv = spec.kv_transfer
    return (
        _reserves_gpus(spec)
        and spec.mode == "disaggregated"
        and kv.backend == "rdma"
        and kv.rdma.resource_name is not None
    )


def _gpu_limits(spec: PDDeploymentSpec, engines: list[EngineContainer]) -> list[dict[str, str]]:
    """Extended-resource limits per engine container.

    hostDevices pins devices through privileged containers and visible-devices variables, yet the
    pod still requests the node's GPUs so that the scheduler and the device plugin hand them to no
    one else: the GPUs no engine uses are added to the first engine's request.
    """
    strategy = spec.gpu_allocation.strategy
    if not _reserves_gpus(spec) or strategy == "dra":
        return [{} for _ in engines]
    counts = [len(e.gpus) for e in engines]
    if strategy == "hostDevices":
        counts[0] += max(spec.node.gpus_per_node - sum(counts), 0)
    return [{spec.gpu_allocation.resource_name: str(c)} for c in counts]


def claim_template(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    """DRA: one ResourceClaimTemplate with one request per engine, pinned by PCI address or index."""
    dra = spec.gpu_allocation.dra
    requests = []
    for eng in engine_containers(spec):
        if dra.pci_addresses:
            listed = ", ".join(json.dumps(dra.pci_addresses[i]) for i in eng.gpus)
            expression = f'device.attributes["gpu.amd.com"].pciAddr in [{listed}]'
        else:
            listed = ", ".join(str(i) for i in eng.gpus)
            expression = f'device.attributes["gpu.amd.com"].{dra.index_attribute} in [{listed}]'
        requests.append(
            {
                "name": eng.name,
                "exactly": {
                    "deviceClassName": dra.device_class_name,
                    "allocationMode": "ExactCount",
                    "count": len(eng.gpus),
                    "selectors": [{"cel": {"expression": expression}}],
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(owner, claim_template_name(owner), COMPONENT_SERVING),
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def _uses_dra(spec: PDDeploymentSpec) -> bool:
    return _reserves_gpus(spec) and spec.gpu_allocation.strategy == "dra"


# ---- containers ---------------------------------------------------------------------------------------


def _http_probe(path: str, port: str, period: int, failures: int, timeout: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _engine_security(spec: PDDeploymentSpec) -> Obj:
    if spec.engine == "simulated":
        return {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    if spec.gpu_allocation.strategy == "hostDevices":
        return {"privileged": True, "seccompProfile": {"type": "Unconfined"}}
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE", "IPC_LOCK"]},
        "seccompProfile": {"type": "Unconfined"},
    }


def _resources(requests: Mapping[str, str], limits: Mapping[str, str]) -> Obj:
    out: Obj = {}
    if requests:
        out["requests"] = dict(requests)
    if limits:
        out["limits"] = dict(limits)
    return out


def _port_prefix(eng: EngineContainer) -> str:
    return {"prefill": "p", "decode": "d"}.get(eng.role, eng.name.replace("engine-", "e"))


def _engine_ports(eng: EngineContainer) -> list[Obj]:
    """Every port the engine binds, each rank's included (with hostNetwork they become host ports)."""
    prefix = _port_prefix(eng)
    return [{"name": f"{prefix}-{n}", "containerPort": p, "protocol": "TCP"} for n, p in eng.named_ports]


def _engine_container(spec: PDDeploymentSpec, eng: EngineContainer, gpu_limits: dict[str, str]) -> Obj:
    settings = eng.settings
    limits = {**settings.resources.limits, **gpu_limits}
    if _uses_nic_resource(spec):
        rdma = spec.kv_transfer.rdma
        limits[str(rdma.resource_name)] = str(rdma.resource_count)
    resources = _resources(settings.resources.requests, limits)
    if _uses_dra(spec):
        resources["claims"] = [{"name": DRA_CLAIM, "request": eng.name}]
    http = f"{_port_prefix(eng)}-http"
    startup_failures = math.ceil(spec.model_storage.load_timeout_seconds / 10)
    mounts: list[Obj] = [{"name": f"dshm-{eng.name}", "mountPath": "/dev/shm"}]
    if _model_volume(spec) is not None:
        storage = spec.model_storage
        mounts.append({"name": "models", "mountPath": storage.mount_path, "readOnly": storage.read_only})
    return {
        "name": eng.name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": engine_command(spec, eng),
        "env": engine_env(spec, eng),
        "ports": _engine_ports(eng),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": _engine_security(spec),
        "startupProbe": _http_probe("/health", http, 10, startup_failures, 5),
        "readinessProbe": _http_probe("/health", http, 5, 3, 5),
        "livenessProbe": _http_probe("/health", http, 15, 6, 10),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


_RESTRICTED: Obj = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


# Read-only root filesystems still need a scratch directory (Python and matplotlib caches).
_TMP_VOLUME: Obj = {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
_TMP_MOUNT: Obj = {"name": "tmp", "mountPath": "/tmp"}


def _proxy_container(spec: PDDeploymentSpec) -> Obj:
    p = spec.proxy
    return {
        "name": PROXY_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": proxy_command(spec),
        "env": proxy_env(spec),
        "ports": [
            {"name": "http", "containerPort": p.port, "protocol": "TCP"},
            {"name": "admin", "containerPort": p.admin_port, "protocol": "TCP"},
        ],
        "resources": _resources(p.resources.requests, p.resources.limits),
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [dict(_TMP_MOUNT)],
        "readinessProbe": _http_probe("/ready", "http", 5, 3, 5),
        "livenessProbe": _http_probe("/health", "http", 15, 6, 10),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# ---- pod --------------------------------------------------------------------------------------------


def _model_volume(spec: PDDeploymentSpec) -> Obj | None:
    storage = spec.model_storage
    if storage.persistent_volume_claim:
        claim = {"claimName": storage.persistent_volume_claim, "readOnly": storage.read_only}
        return {"name": "models", "persistentVolumeClaim": claim}
    if storage.host_path:
        return {"name": "models", "hostPath": {"path": storage.host_path, "type": "DirectoryOrCreate"}}
    return None


def _volumes(spec: PDDeploymentSpec, engines: list[EngineContainer]) -> list[Obj]:
    volumes: list[Obj] = [
        {"name": f"dshm-{e.name}", "emptyDir": {"medium": "Memory", "sizeLimit": e.settings.shm_size}} for e in engines
    ]
    model = _model_volume(spec)
    return [*volumes, *([model] if model else []), dict(_TMP_VOLUME)]


def _pod_spec(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    engines = engine_containers(spec)
    limits = _gpu_limits(spec, engines)
    containers = [_engine_container(spec, e, lim) for e, lim in zip(engines, limits, strict=True)]
    pod: Obj = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [*containers, _proxy_container(spec)],
        "volumes": _volumes(spec, engines),
    }
    selector = spec.effective_node_selector()
    if selector:
        pod["nodeSelector"] = selector
    node = spec.node
    if node.tolerations:
        pod["tolerations"] = list(node.tolerations)
    if node.affinity:
        pod["affinity"] = dict(node.affinity)
    if node.priority_class_name:
        pod["priorityClassName"] = node.priority_class_name
    if spec.engine == "vllm" and spec.mode == "disaggregated" and spec.kv_transfer.rdma.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if _uses_dra(spec):
        pod["resourceClaims"] = [{"name": DRA_CLAIM, "resourceClaimTemplateName": claim_template_name(owner)}]
    return pod


def spec_hash(pod_spec: Mapping[str, Any]) -> str:
    """A digest of the rendered pod spec; a different digest on the live pod means: roll it."""
    return hashlib.sha256(json.dumps(pod_spec, sort_keys=True).encode()).hexdigest()[:16]


def pod(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    pod_spec = _pod_spec(owner, spec)
    meta = _metadata(owner, pod_name(owner), COMPONENT_SERVING)
    meta["annotations"] = {ANNOTATION_SPEC_HASH: spec_hash(pod_spec), ANNOTATION_GENERATION: str(owner.generation)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


# ---- service, network policy, probe job ------------------------------------------------------------------


def service(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    """Only the proxy's OpenAI port; engines and the admin port stay unexposed."""
    port = {"name": "http", "port": spec.proxy.port, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, service_name(owner), COMPONENT_SERVING),
        "spec": {"type": spec.proxy.service_type, "selector": serving_selector(owner), "ports": [port]},
    }


def network_policy(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    """The API port from anywhere, the admin port from the operator, anything from the pod itself.

    vLLM's handshake and notify listeners bind all addresses and trust what they receive; the engines
    and the proxy reach each other over the pod IP, hence the self rule.
    """
    proxy = spec.proxy
    operator_peer = {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, owner.name, COMPONENT_SERVING),
        "spec": {
            "podSelector": {"matchLabels": serving_selector(owner)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"port": proxy.port, "protocol": "TCP"}]},
                {"from": [operator_peer], "ports": [{"port": proxy.admin_port, "protocol": "TCP"}]},
                {"from": [{"podSelector": {"matchLabels": serving_selector(owner)}}]},
            ],
        },
    }


def probe_job(owner: Owner, spec: PDDeploymentSpec, job_name: str) -> Obj:
    """The goodput probe: `pdctl bench` against the Service; its summary becomes the termination message."""
    probe = spec.goodput_probe
    container = {
        "name": BENCH_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": bench_command(spec, service_url(owner, spec)),
        "env": bench_env(spec),
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [dict(_TMP_MOUNT)],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }
    job_labels = labels(owner, COMPONENT_PROBE)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(owner, job_name, COMPONENT_PROBE),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": probe.timeout_seconds,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [dict(_TMP_VOLUME)],
                },
            },
        },
    }


def children(owner: Owner, spec: PDDeploymentSpec) -> list[Obj]:
    """Everything the operator keeps in place for a PDDeployment, in creation order (pod last)."""
    objs = [service(owner, spec), network_policy(owner, spec)]
    if _uses_dra(spec):
        objs.insert(0, claim_template(owner, spec))
    return [*objs, pod(owner, spec)]


def gpu_devices_pinned(spec: PDDeploymentSpec) -> bool:
    """Whether the GPU indices of the spec are the physical ones (hostDevices, dra)."""
    return _reserves_gpus(spec) and spec.gpu_allocation.strategy in ("hostDevices", "dra")


def gpus_reserved(spec: PDDeploymentSpec) -> bool:
    return _reserves_gpus(spec)
