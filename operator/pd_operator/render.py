"""Pure: a layout (layout.py) -> every Kubernetes object the operator creates for it.

Why a bare Pod and not a one-replica Deployment (with Recreate): the pod holds every GPU of the node,
so no surge is possible and a rollout must be delete-then-create anyway; the operator needs the exact
pod (one name, its containerStatuses) to report per-role readiness and GPU assignment, and it already
watches it, so a ReplicaSet controller in between would add a second owner of the same decision
without adding behaviour. The router (spec.router) is the opposite case, stateless and GPU-less, so it
is a Deployment. The operator recreates a deleted pod
and rolls it when the rendered spec changes (``pd.serving.dev/spec-hash``). Replicas are more such pods
with stable names (``NAME``, ``NAME-1``, ...), for the same reasons not a StatefulSet: the rollout waits
for each replacement's KVTransferVerified, which only the operator reads (serving_pods.rollout).

Every setting travels in the containers' command lines and env, so ``kubectl get pod -o yaml`` shows
what runs, except the proxy's routing and timeouts: they are in the ``<name>-proxy`` ConfigMap, which
the proxy container mounts and re-reads. The spec hash covers the pod spec only, so changing them
updates the ConfigMap and restarts nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_operator import api
from pd_operator.api import PROXY_SETTINGS_DIR
from pd_operator.command_lines import (
    ADMIN_KEY,
    ENGINE_KEY,
    LOOPBACK,
    PROXY_ADMIN_KEY_ENV,
    PROXY_SETTINGS_KEY,
    TERMINATION_LOG,
)
from pd_operator.layout import EngineInstance, Layout, Owner

Obj = dict[str, Any]

LABEL_DEPLOYMENT = f"{api.GROUP}/deployment"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "pd-operator"
ANNOTATION_SPEC_HASH = f"{api.GROUP}/spec-hash"
ANNOTATION_GENERATION = f"{api.GROUP}/generation"
COMPONENT_SERVING = "serving"
COMPONENT_PROBE = "goodput-probe"
COMPONENT_ROUTER = "router"
OPERATOR_POD_LABELS = {f"{api.GROUP}/operator": "true"}  # set by the chart on the operator's pods
# The operator's namespace when rendering offline (pdctl render): the README's install namespace. The
# operator itself renders its own (pdctl operator --operator-namespace, the chart's downward API).
OPERATOR_NAMESPACE = "pd-system"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
DRA_CLAIM = "gpus"
PROXY_CONTAINER = "proxy"
BENCH_CONTAINER = "bench"


# ---- names and metadata --------------------------------------------------------------------------


def pod_name(owner: Owner, index: int = 0) -> str:
    """Replica 0 keeps the name a single-replica deployment always had; the others get their index."""
    return owner.name if index == 0 else f"{owner.name}-{index}"


def service_name(owner: Owner) -> str:
    return owner.name


def _digest(value: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:length]


def proxy_settings_name(owner: Owner) -> str:
    return f"{owner.name}-proxy"


def router_name(owner: Owner) -> str:
    """The router's Deployment, Service, ServiceAccount, Role and RoleBinding all share this name."""
    return f"{owner.name}-router"


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pddeployment",
        "app.kubernetes.io/instance": owner.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGER,
        "app.kubernetes.io/part-of": "pd-serving",
        LABEL_DEPLOYMENT: owner.name,
    }


def serving_selector(owner: Owner) -> dict[str, str]:
    return {LABEL_DEPLOYMENT: owner.name, LABEL_COMPONENT: COMPONENT_SERVING}


def router_selector(owner: Owner) -> dict[str, str]:
    return {LABEL_DEPLOYMENT: owner.name, LABEL_COMPONENT: COMPONENT_ROUTER}


def selector_string(owner: Owner) -> str:
    """The serving selector as the scale subresource reports it (``status.selector``)."""
    return ",".join(f"{k}={v}" for k, v in sorted(serving_selector(owner).items()))


def owner_reference(owner: Owner) -> Obj:
    """The PDDeployment as its children's controller (deleted with it, acted on by it alone)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(owner: Owner, name: str, component: str) -> Obj:
    meta: Obj = {"name": name, "namespace": owner.namespace, "labels": labels(owner, component)}
    if owner.uid:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta


# ---- GPUs -------------------------------------------------------------------------------------------


def _claim_template_spec(lay: Layout) -> Obj:
    requests = [
        {
            "name": eng.name,
            "exactly": {
                "deviceClassName": lay.dra_device_class,
                "allocationMode": "ExactCount",
                "count": len(eng.gpus),
                "selectors": [{"cel": {"expression": eng.device_selector}}],
            },
        }
        for eng in lay.engines
    ]
    return {"spec": {"devices": {"requests": requests}}}


def claim_template_name(lay: Layout) -> str:
    """``<name>-gpus-<digest of the template>``: a ResourceClaimTemplate's spec is immutable, so a changed
    template is a new object under a new name, and the pod that refers to it changes with it (and rolls)."""
    return f"{lay.owner.name}-gpus-{_digest(_claim_template_spec(lay), 10)}"


def claim_template(lay: Layout) -> Obj:
    """DRA: one ResourceClaimTemplate with one request per engine, pinned by PCI address."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(lay.owner, claim_template_name(lay), COMPONENT_SERVING),
        "spec": _claim_template_spec(lay),
    }


# ---- containers ---------------------------------------------------------------------------------------


def _http_probe(path: str, port: str, period: int, failures: int, timeout: int, host: str | None = None) -> Obj:
    """An httpGet probe; ``host`` for a server on the pod's loopback, which with hostNetwork is the node's,
    where the kubelet probes from."""
    return {
        "httpGet": {"path": path, "port": port, **({"host": host} if host else {})},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _engine_security(lay: Layout) -> Obj:
    if lay.simulated:
        return {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    if lay.privileged_engines:
        return {"privileged": True, "seccompProfile": {"type": "Unconfined"}}
    # seccomp Unconfined and SYS_PTRACE: AMD's guidance for non-privileged GPU containers and vLLM's ROCm
    # recipe; IPC_LOCK only where RDMA pins memory regions (beyond RLIMIT_MEMLOCK). docs/gpu-allocation.md
    # has the Pod Security level each combination needs.
    added = ["SYS_PTRACE", "IPC_LOCK"] if lay.rdma_engines else ["SYS_PTRACE"]
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": added},
        "seccompProfile": {"type": "Unconfined"},
    }


def _resources(requests: Mapping[str, str], limits: Mapping[str, str]) -> Obj:
    out: Obj = {}
    if requests:
        out["requests"] = dict(requests)
    if limits:
        out["limits"] = dict(limits)
    return out


def _engine_container(lay: Layout, eng: EngineInstance) -> Obj:
    resources = _resources(eng.requests, eng.limits)
    if eng.device_selector is not None:
        resources["claims"] = [{"name": DRA_CLAIM, "request": eng.name}]
    http = f"{eng.port_prefix}-http"
    loopback = LOOPBACK if lay.host_network else None  # the engines' HTTP servers listen there only
    mounts: list[Obj] = [
        {"name": f"dshm-{eng.name}", "mountPath": "/dev/shm"},
        {"name": lay.cache.volume["name"], "mountPath": lay.cache.mount_path},
    ]
    if lay.model is not None:
        mounts.append({"name": "models", "mountPath": lay.model.mount_path, "readOnly": lay.model.read_only})
    mounts += _template_mounts(lay, eng.role)
    return {
        "name": eng.name,
        "image": lay.image,
        "imagePullPolicy": lay.image_pull_policy,
        "command": list(eng.argv),
        "env": [dict(e) for e in eng.env],
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in eng.ports],
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": _engine_security(lay),
        "startupProbe": _http_probe("/health", http, 10, lay.startup_failure_threshold, 5, loopback),
        "readinessProbe": _http_probe("/health", http, 5, 3, 5, loopback),
        "livenessProbe": _http_probe("/health", http, 15, 6, 10, loopback),
        "lifecycle": {"preStop": {"exec": {"command": list(eng.pre_stop)}}},
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
PROXY_SETTINGS_VOLUME = "pd-proxy-settings"
# The whole directory, never a subPath: only a directory mount sees the kubelet's updates.
_PROXY_SETTINGS_MOUNT: Obj = {"name": PROXY_SETTINGS_VOLUME, "mountPath": PROXY_SETTINGS_DIR, "readOnly": True}


def _proxy_container(lay: Layout) -> Obj:
    p = lay.proxy
    return {
        "name": PROXY_CONTAINER,
        "image": lay.image,
        "imagePullPolicy": lay.image_pull_policy,
        "command": list(p.argv),
        "env": [dict(e) for e in p.env],
        "ports": [
            {"name": "http", "containerPort": p.port, "protocol": "TCP"},
            {"name": "admin", "containerPort": p.admin_port, "protocol": "TCP"},
        ],
        "resources": _resources(p.requests, p.limits),
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [dict(_TMP_MOUNT), dict(_PROXY_SETTINGS_MOUNT), *_template_mounts(lay, "proxy")],
        "readinessProbe": _http_probe("/ready", "http", 5, 3, 5),
        "livenessProbe": _http_probe("/health", "http", 15, 6, 10),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# ---- pod --------------------------------------------------------------------------------------------


def _template_mounts(lay: Layout, role: str) -> list[Obj]:
    """spec.podTemplate.volumeMounts of one role (every engine of the role, or the proxy)."""
    return [m.model_dump(by_alias=True, exclude_none=True) for m in lay.pod_template.volume_mounts.of(role)]


def _volumes(lay: Layout) -> list[Obj]:
    volumes: list[Obj] = [
        {"name": f"dshm-{e.name}", "emptyDir": {"medium": "Memory", "sizeLimit": e.shm_size}} for e in lay.engines
    ]
    model = [dict(lay.model.volume)] if lay.model else []
    volumes.append(dict(lay.cache.volume))
    settings = {"name": PROXY_SETTINGS_VOLUME, "configMap": {"name": proxy_settings_name(lay.owner)}}
    return [*volumes, *model, dict(_TMP_VOLUME), settings, *(dict(v) for v in lay.pod_template.volumes)]


def _pull_secrets(lay: Layout) -> Obj:
    secrets = lay.pod_template.image_pull_secrets
    return {"imagePullSecrets": [dict(s) for s in secrets]} if secrets else {}


def _pod_spec(lay: Layout) -> Obj:
    pod: Obj = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": lay.termination_grace_period_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [*(_engine_container(lay, e) for e in lay.engines), _proxy_container(lay)],
        "volumes": _volumes(lay),
        **_pull_secrets(lay),
    }
    template = lay.pod_template
    if template.service_account_name:
        pod["serviceAccountName"] = template.service_account_name
    if template.runtime_class_name:
        pod["runtimeClassName"] = template.runtime_class_name
    if lay.node_selector:
        pod["nodeSelector"] = dict(lay.node_selector)
    if lay.tolerations:
        pod["tolerations"] = [dict(t) for t in lay.tolerations]
    if lay.affinity:
        pod["affinity"] = dict(lay.affinity)
    if lay.priority_class_name:
        pod["priorityClassName"] = lay.priority_class_name
    if lay.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if lay.dra_device_class is not None:
        pod["resourceClaims"] = [{"name": DRA_CLAIM, "resourceClaimTemplateName": claim_template_name(lay)}]
    return pod


def spec_hash(pod_spec: Mapping[str, Any]) -> str:
    """A digest of the rendered pod spec; a different digest on the live pod means: roll it."""
    return _digest(pod_spec, 16)


def pod(lay: Layout, index: int = 0) -> Obj:
    """The serving pod of one replica; every replica has the same spec (and spec hash), only the name differs.

    spec.podTemplate's labels and annotations go under the operator's own. The user's metadata joins the
    hash (CNI plugins such as Multus read annotations only when the pod starts, so a change needs a new
    pod); without any, the hash is the pod spec's alone, as before.
    """
    pod_spec = _pod_spec(lay)
    owner = lay.owner
    meta = _metadata(owner, pod_name(owner, index), COMPONENT_SERVING)
    extra = lay.pod_template.metadata
    hashed = {**pod_spec, "podTemplateMetadata": extra.model_dump()} if extra.labels or extra.annotations else pod_spec
    meta["labels"] = {**extra.labels, **meta["labels"]}
    meta["annotations"] = {
        **extra.annotations,
        ANNOTATION_SPEC_HASH: spec_hash(hashed),
        ANNOTATION_GENERATION: str(owner.generation),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


# ---- service, network policy, probe job ------------------------------------------------------------------


def service(lay: Layout) -> Obj:
    """Only the proxy's OpenAI port; engines and the admin port stay unexposed."""
    return _api_service(lay, service_name(lay.owner), COMPONENT_SERVING, serving_selector(lay.owner))


def _api_service(lay: Layout, name: str, component: str, selector: dict[str, str]) -> Obj:
    """A Service for the OpenAI API port of the pods selected (the serving pods' proxies, or the router)."""
    port = {"name": "http", "port": lay.proxy.port, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(lay.owner, name, component),
        "spec": {"type": lay.proxy.service_type, "selector": selector, "ports": [port]},
    }


def _tcp(*ports: int) -> list[Obj]:
    return [{"port": port, "protocol": "TCP"} for port in ports]


def _metrics_ports(lay: Layout) -> list[Obj]:
    """Where metrics are served: each engine's vLLM /metrics on its HTTP port, the proxy's on its admin port."""
    engines = [port for e in lay.engines for name, port in e.ports if name == f"{e.port_prefix}-http"]
    return _tcp(*engines, lay.proxy.admin_port)


def proxy_settings(lay: Layout) -> Obj:
    """The proxy's reloadable settings (routing, timeouts) as the file it re-reads when it changes."""
    text = json.dumps(dict(lay.proxy.settings), indent=2, sort_keys=True) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(lay.owner, proxy_settings_name(lay.owner), COMPONENT_SERVING),
        "data": {PROXY_SETTINGS_KEY: text},
    }


# The keys of the credentials Secret, each a random value drawn when the Secret is created (256 bits).
CREDENTIAL_KEYS = (ENGINE_KEY, ADMIN_KEY)
KEY_BYTES = 32


def credentials(lay: Layout) -> Obj:
    """The pod's keys, without their values: the operator creates this Secret once, when absent, each of
    ``CREDENTIAL_KEYS`` a random value it draws then, and never applies it, so no resync changes a key the
    running containers hold (they read it from their environment when they start)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(lay.owner, lay.credentials, COMPONENT_SERVING),
        "type": "Opaque",
    }


def network_policy(lay: Layout, operator_namespace: str = OPERATOR_NAMESPACE) -> Obj:
    """The API port from anywhere, the admin port from the operator, metrics to the configured scrapers,
    anything from the pod itself.

    vLLM's handshake and notify listeners bind all addresses and trust what they receive; the engines
    and the proxy reach each other over the pod IP, hence the self rule. Scrapers get the metrics ports
    only (spec.networkPolicy.metricsFrom), not the side channels. The operator is its label in its own
    namespace only: a tenant can label a pod of theirs as the operator, not move it there.
    """
    owner, proxy = lay.owner, lay.proxy
    operator_peer = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
        "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
    }
    scrapers = [{"from": [dict(p) for p in lay.metrics_from], "ports": _metrics_ports(lay)}] if lay.metrics_from else []
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, owner.name, COMPONENT_SERVING),
        "spec": {
            "podSelector": {"matchLabels": serving_selector(owner)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": _tcp(proxy.port)},
                {"from": [operator_peer], "ports": _tcp(proxy.admin_port)},
                *scrapers,
                *_router_ingress(lay),
                {"from": [{"podSelector": {"matchLabels": serving_selector(owner)}}]},
            ],
        },
    }


def _router_ingress(lay: Layout) -> list[Obj]:
    """The router pods reach every replica's API port and the admin port it reads load from."""
    if not lay.router_replicas:
        return []
    ports = _tcp(lay.proxy.port, lay.proxy.admin_port)
    return [{"from": [{"podSelector": {"matchLabels": router_selector(lay.owner)}}], "ports": ports}]


def disruption_budget_name(owner: Owner) -> str:
    return owner.name


def disruption_budget(lay: Layout) -> Obj:
    """Node drains (the eviction API) keep replicas - maxUnavailable pods serving; 0 with one replica."""
    owner = lay.owner
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, disruption_budget_name(owner), COMPONENT_SERVING),
        "spec": {
            "minAvailable": max(lay.replicas - lay.max_unavailable, 0),
            "selector": {"matchLabels": serving_selector(owner)},
        },
    }


INFERENCE_POOL_API = "inference.networking.k8s.io/v1"


def inference_pool_name(owner: Owner) -> str:
    return owner.name


def inference_pool(lay: Layout) -> Obj | None:
    """The Gateway API Inference Extension's view of the serving pods: members by label, the proxy's API
    port as the one target port, and the user's endpoint picker; None unless spec.inferencePool is on.

    The target is the proxy, not an engine: a gateway that picks a pod hands the request to that pod's
    proxy, which runs both legs (prefill, then decode) as for any other client.
    """
    picker = lay.endpoint_picker
    if picker is None:
        return None
    owner = lay.owner
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": _metadata(owner, inference_pool_name(owner), COMPONENT_SERVING),
        "spec": {
            "selector": {"matchLabels": serving_selector(owner)},
            "targetPorts": [{"number": lay.proxy.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode,
            },
        },
    }


def probe_job(lay: Layout, job_name: str, image: str | None = None) -> Obj:
    """The goodput probe: `pdctl bench` against the Service; its summary becomes the termination message.

    ``image`` is the operator's own (``pdctl operator --probe-image``, set by the chart): the small image
    has `pdctl bench`, so the probe need not pull the multi-GB ROCm runtime image; without it, the
    spec's runtime image (which has it too).
    """
    owner = lay.owner
    container = {
        "name": BENCH_CONTAINER,
        "image": image or lay.image,
        "imagePullPolicy": lay.image_pull_policy,
        "command": list(lay.probe.argv),
        "env": [dict(e) for e in lay.probe.env],
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
            "activeDeadlineSeconds": lay.probe.timeout_seconds,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [dict(_TMP_VOLUME)],
                    **_pull_secrets(lay),
                },
            },
        },
    }


# ---- router ------------------------------------------------------------------------------------------------

ROUTER_CONTAINER = "router"
# What the router's ServiceAccount may do, and so (RBAC escalation rule) what the operator must hold itself.
ROUTER_RULES: tuple[Obj, ...] = (
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
)
# Everything the router renders, for deleting it when spec.router.enabled goes false. The Deployment goes
# last: the operator looks for it to know whether there is anything to delete.
ROUTER_KINDS = (
    "Service",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "RoleBinding",
    "Role",
    "ServiceAccount",
    "Deployment",
)
# The API server's ports as a router pod's egress meets them: the kubernetes Service's 443, or after
# its DNAT the endpoint's own port (6443 with kubeadm, k3s and kind; 443 on most managed clusters).
API_SERVER_PORTS = (443, 6443)


def _router_container(lay: Layout) -> Obj:
    owner, proxy = lay.owner, lay.proxy
    argv = ["pdctl", "proxy", "--router", "--pddeployment", owner.name, "--namespace", owner.namespace]
    argv += [
        "--host",
        "0.0.0.0",
        "--port",
        str(proxy.port),
        "--backend-port",
        str(proxy.port),
        "--admin-port",
        str(proxy.admin_port),
    ]
    return {
        "name": ROUTER_CONTAINER,
        "image": lay.image,
        "imagePullPolicy": lay.image_pull_policy,
        "command": argv,
        # the replicas' admin /status, which it reads load from, asks for the admin key
        "env": [
            {"name": PROXY_ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": lay.credentials, "key": ADMIN_KEY}}}
        ],
        "ports": [{"name": "http", "containerPort": proxy.port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [dict(_TMP_MOUNT)],
        # Ready once it has found a ready replica; /health answers as long as it runs.
        "readinessProbe": _http_probe("/ready", "http", 5, 3, 5),
        "livenessProbe": _http_probe("/health", "http", 15, 6, 10),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def router_deployment(lay: Layout) -> Obj:
    """Stateless pods, so a Deployment (rolling, surge allowed): unlike the serving pods they hold no GPUs."""
    owner = lay.owner
    pod_spec: Obj = {
        "serviceAccountName": router_name(owner),
        "automountServiceAccountToken": True,  # the EndpointSlice watch authenticates with it
        "enableServiceLinks": False,
        "containers": [_router_container(lay)],
        "volumes": [dict(_TMP_VOLUME)],
        # Spread across nodes where the scheduler can, so losing one node leaves a router; never a reason
        # not to schedule (a one-node cluster still gets every replica).
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": router_selector(owner)},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        **_pull_secrets(lay),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, router_name(owner), COMPONENT_ROUTER),
        "spec": {
            "replicas": lay.router_replicas,
            "selector": {"matchLabels": router_selector(owner)},
            "template": {"metadata": {"labels": labels(owner, COMPONENT_ROUTER)}, "spec": pod_spec},
        },
    }


def router_service(lay: Layout) -> Obj:
    return _api_service(lay, router_name(lay.owner), COMPONENT_ROUTER, router_selector(lay.owner))


def router_disruption_budget(lay: Layout) -> Obj:
    """Node drains evict one router pod at a time (only rendered with more than one: with one it would
    either block every drain or protect nothing)."""
    owner = lay.owner
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, router_name(owner), COMPONENT_ROUTER),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_selector(owner)}},
    }


def router_network_policy(lay: Layout) -> Obj:
    """In: the router's one port (API, /status, probes) from anywhere, as the serving API port; scrapers
    (spec.networkPolicy.metricsFrom) are inside "anywhere", the router has no separate admin port.
    Out: the serving pods' API and admin ports, the API server (its EndpointSlice watch) and DNS (it
    resolves kubernetes.default.svc); nothing else.

    NetworkPolicy cannot name the API server (no pod, its address is the cluster's), so that rule is
    by port only; DNS likewise, so node-local DNS caches keep working.
    """
    owner, proxy = lay.owner, lay.proxy
    dns = [{"port": 53, "protocol": protocol} for protocol in ("UDP", "TCP")]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, router_name(owner), COMPONENT_ROUTER),
        "spec": {
            "podSelector": {"matchLabels": router_selector(owner)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"ports": _tcp(proxy.port)}],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": serving_selector(owner)}}],
                    "ports": _tcp(proxy.port, proxy.admin_port),
                },
                {"ports": _tcp(*API_SERVER_PORTS)},
                {"ports": dns},
            ],
        },
    }


def router_rbac(lay: Layout) -> list[Obj]:
    """ServiceAccount, Role (read EndpointSlices in this namespace only) and the RoleBinding between them."""
    owner = lay.owner
    name = router_name(owner)
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(owner, name, COMPONENT_ROUTER)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": _metadata(owner, name, COMPONENT_ROUTER),
            "rules": [dict(r) for r in ROUTER_RULES],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(owner, name, COMPONENT_ROUTER),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]


def router(lay: Layout) -> list[Obj]:
    """The router's objects, RBAC and NetworkPolicy first so the pods start with them in place; none when
    disabled."""
    if not lay.router_replicas:
        return []
    budget = [router_disruption_budget(lay)] if lay.router_replicas > 1 else []
    return [*router_rbac(lay), router_network_policy(lay), *budget, router_service(lay), router_deployment(lay)]


@dataclass(frozen=True)
class Children:
    """Everything the operator keeps in place for a PDDeployment.

    ``applied`` objects are kept by server-side apply (drift repair); the pods (one per replica) are
    created and, when their spec hash changes, deleted and created again, because most of a pod's spec
    cannot change in place. The ``credentials`` Secret is created when absent and otherwise left alone.
    """

    credentials: Obj
    applied: tuple[Obj, ...]
    pods: tuple[Obj, ...]

    @property
    def pod(self) -> Obj:
        """The first replica's pod (the only one with replicas 1)."""
        return self.pods[0]

    @property
    def all(self) -> list[Obj]:
        """In creation order: the Secret and the claim template before the pods that refer to them, the
        pods last."""
        return [self.credentials, *self.applied, *self.pods]


def children(lay: Layout, operator_namespace: str = OPERATOR_NAMESPACE) -> Children:
    """``operator_namespace``: where the operator runs, the one namespace its admin-port peer may be in."""
    applied = [
        service(lay),
        network_policy(lay, operator_namespace),
        disruption_budget(lay),
        proxy_settings(lay),
        *router(lay),
    ]
    if lay.dra_device_class is not None:
        applied.insert(0, claim_template(lay))
    if (pool := inference_pool(lay)) is not None:
        applied.append(pool)
    pods = tuple(pod(lay, i) for i in range(lay.replicas))
    return Children(credentials=credentials(lay), applied=tuple(applied), pods=pods)
