"""Pure: a validated spec -> its layout, every fact the objects need, derived once.

The layout lists every engine instance of the pod with its GPUs, ports, command line, environment,
resources and devices, then the proxy and the goodput probe. render.py turns a layout into objects and
observe.py reads engine names, roles and GPUs from it; neither goes back to the spec. Engines are a
list, so more engines per role mean a longer list, not new branches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pd_operator import qos
from pd_operator.api.placement import PodTemplateSpec
from pd_operator.api.serving import EndpointPickerSpec
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.command_lines import (
    EngineContainer,
    EngineRoleName,
    EnvEntry,
    bench_command,
    bench_env,
    engine_command,
    engine_containers,
    engine_env,
    engine_pre_stop_command,
    proxy_command,
    proxy_env,
    proxy_settings,
)

Obj = dict[str, Any]
GpuStrategy = Literal["devicePlugin", "hostDevices", "dra", "none"]
STARTUP_PROBE_PERIOD_S = 10


@dataclass(frozen=True)
class Owner:
    """The PDDeployment the objects belong to; ``uid`` is empty when rendering a file offline."""

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0


def credentials_name(owner: Owner) -> str:
    """The Secret of the pod's keys (the engines' key), which the operator creates once with random values."""
    return f"{owner.name}-credentials"


def service_url(owner: Owner, port: int) -> str:
    """The proxy's API behind the Service (the Service is named after the deployment)."""
    return f"http://{owner.name}.{owner.namespace}.svc:{port}"


@dataclass(frozen=True)
class EngineInstance:
    """One engine container: what it runs, where it listens, which GPUs and devices it gets."""

    name: str
    role: EngineRoleName
    gpus: tuple[int, ...]
    gpu_range: str  # as the spec wrote it, e.g. "0-3"
    tensor_parallel_size: int
    port_prefix: str  # container port names are <prefix>-http, <prefix>-handshake, <prefix>-notify
    ports: tuple[tuple[str, int], ...]
    argv: tuple[str, ...]
    pre_stop: tuple[str, ...]  # the preStop hook: wait until the pod's proxy has drained
    env: tuple[EnvEntry, ...]
    requests: Mapping[str, str]
    limits: Mapping[str, str]  # CPU and memory (qos.py) plus GPU and NIC extended resources
    shm_size: str
    device_selector: str | None  # DRA: the CEL expression pinning this engine's GPUs


@dataclass(frozen=True)
class ProxyInstance:
    argv: tuple[str, ...]
    env: tuple[EnvEntry, ...]
    settings: Mapping[str, Any]  # the reloadable ones, rendered into the proxy's ConfigMap
    port: int
    admin_port: int
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    service_type: str


@dataclass(frozen=True)
class ProbeInstance:
    """The goodput probe Job's container (only used when probes are enabled)."""

    argv: tuple[str, ...]
    env: tuple[EnvEntry, ...]
    timeout_seconds: int


@dataclass(frozen=True)
class ModelVolume:
    volume: Obj  # the pod volume named "models"
    mount_path: str
    read_only: bool


@dataclass(frozen=True)
class CacheVolume:
    volume: Obj  # the pod volume named "pd-engine-cache"
    mount_path: str


@dataclass(frozen=True)
class Layout:
    owner: Owner
    image: str
    image_pull_policy: str
    engines: tuple[EngineInstance, ...]
    proxy: ProxyInstance
    probe: ProbeInstance
    gpu_strategy: GpuStrategy  # "none" when the engines reserve no GPUs
    dra_device_class: str | None  # set when a ResourceClaimTemplate pins the GPUs
    privileged_engines: bool  # hostDevices with real engines
    rdma_engines: bool  # real engines moving KV over RDMA: they pin memory (IPC_LOCK)
    simulated: bool
    model: ModelVolume | None
    cache: CacheVolume
    startup_failure_threshold: int
    termination_grace_period_seconds: int
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    affinity: Mapping[str, Any] | None
    priority_class_name: str | None
    host_network: bool
    credentials: str  # the Secret of the pod's keys (credentials_name), created once by the operator
    replicas: int
    max_unavailable: int
    pod_template: PodTemplateSpec  # what the user adds to the serving pod (labels, volumes, ...)
    metrics_from: tuple[Mapping[str, Any], ...]  # NetworkPolicy peers allowed to scrape metrics
    router_replicas: int  # 0: no router
    endpoint_picker: EndpointPickerSpec | None  # set when an InferencePool is rendered

    def engine(self, name: str) -> EngineInstance | None:
        return next((e for e in self.engines if e.name == name), None)


# ---- engines ----------------------------------------------------------------------------------------------


def _port_prefix(eng: EngineContainer) -> str:
    """p, d (one engine per role), p0, p1, d0 (several), e0, e1 (colocated): port names stay <= 15 characters."""
    index = eng.name.rpartition("-")[2] if "-" in eng.name else ""
    return {"prefill": "p", "decode": "d", "engine": "e"}[eng.role] + index


def _gpu_counts(spec: PDDeploymentSpec, engines: list[EngineContainer]) -> list[int | None]:
    """GPUs each engine requests as an extended resource (None: none requested).

    hostDevices pins devices through privileged containers and visible-devices variables, yet the
    pod still requests the node's GPUs so that the scheduler and the device plugin hand them to no
    one else: the GPUs no engine uses are added to the first engine's request.
    """
    if not spec.reserves_gpus or spec.uses_dra:
        return [None for _ in engines]
    counts: list[int | None] = [len(e.gpus) for e in engines]
    if spec.gpu_allocation.strategy == "hostDevices":
        counts[0] = len(engines[0].gpus) + max(spec.node.gpus_per_node - sum(len(e.gpus) for e in engines), 0)
    return counts


# The AMD DRA driver names a GPU's PCI address with the standard attribute (k8s.io/dynamic-resource-
# allocation deviceattribute.StandardDeviceAttributePCIBusID); its releases of 2025 used gpu.amd.com/pciAddr.
# A selector that reads an attribute a device lacks fails the allocation, hence the guards.
PCI_ATTRIBUTES = (("resource.kubernetes.io", "pciBusID"), ("gpu.amd.com", "pciAddr"))


def _device_selector(spec: PDDeploymentSpec, eng: EngineContainer) -> str | None:
    """DRA: this engine's GPUs by PCI address (admission requires the addresses for strategy dra)."""
    if not spec.uses_dra:
        return None
    listed = "[" + ", ".join(json.dumps(spec.gpu_allocation.dra.pci_addresses[i]) for i in eng.gpus) + "]"
    return " || ".join(
        f'("{name}" in device.attributes["{domain}"] && device.attributes["{domain}"].{name} in {listed})'
        for domain, name in PCI_ATTRIBUTES
    )


def _engine(spec: PDDeploymentSpec, owner: Owner, eng: EngineContainer, gpu_count: int | None) -> EngineInstance:
    settings = eng.settings
    selector = _device_selector(spec, eng)
    requests, limits = qos.engine(spec, settings, len(eng.gpus))
    if gpu_count is not None:
        limits[spec.gpu_allocation.resource_name] = str(gpu_count)
    if spec.uses_nic_resource:
        rdma = spec.kv_transfer.rdma
        limits[str(rdma.resource_name)] = str(rdma.resource_count)
    prefix = _port_prefix(eng)
    return EngineInstance(
        name=eng.name,
        role=eng.role,
        gpus=tuple(eng.gpus),
        gpu_range=eng.gpu_range,
        tensor_parallel_size=settings.tensor_parallel_size,
        port_prefix=prefix,
        ports=tuple((f"{prefix}-{n}", p) for n, p in eng.named_ports),  # every rank's listener
        argv=tuple(engine_command(spec, eng)),
        pre_stop=tuple(engine_pre_stop_command(spec)),
        env=tuple(engine_env(spec, eng, credentials_name(owner))),
        requests=requests,
        limits=limits,
        shm_size=settings.shm_size,
        device_selector=selector,
    )


# ---- the rest ----------------------------------------------------------------------------------------------


def _claim_or_node_dir(name: str, claim: str | None, host_path: str | None, read_only: bool) -> Obj | None:
    if claim:
        return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
    if host_path:
        return {"name": name, "hostPath": {"path": host_path, "type": "DirectoryOrCreate"}}
    return None


def _model_volume(spec: PDDeploymentSpec) -> ModelVolume | None:
    storage = spec.model_storage
    volume = _claim_or_node_dir("models", storage.persistent_volume_claim, storage.host_path, storage.read_only)
    return None if volume is None else ModelVolume(volume, storage.mount_path, storage.read_only)


def _cache_volume(spec: PDDeploymentSpec) -> CacheVolume:
    """An emptyDir by default: it survives container restarts; a claim or node directory survives the pod."""
    c = spec.cache_storage
    volume = _claim_or_node_dir("pd-engine-cache", c.persistent_volume_claim, c.host_path, False)
    return CacheVolume(volume or {"name": "pd-engine-cache", "emptyDir": {"sizeLimit": c.size_limit}}, c.mount_path)


def build(owner: Owner, spec: PDDeploymentSpec) -> Layout:
    """The one pass from spec to layout."""
    containers = engine_containers(spec)
    counts = _gpu_counts(spec, containers)
    p, probe = spec.proxy, spec.goodput_probe
    proxy_requests, proxy_limits = qos.proxy(spec)
    return Layout(
        owner=owner,
        image=spec.image,
        image_pull_policy=spec.image_pull_policy,
        engines=tuple(_engine(spec, owner, e, c) for e, c in zip(containers, counts, strict=True)),
        proxy=ProxyInstance(
            argv=tuple(proxy_command(spec)),
            env=tuple(proxy_env(spec, credentials_name(owner))),
            settings=proxy_settings(spec),
            port=p.port,
            admin_port=p.admin_port,
            requests=proxy_requests,
            limits=proxy_limits,
            service_type=p.service_type,
        ),
        probe=ProbeInstance(
            argv=tuple(bench_command(spec, service_url(owner, p.port))),
            env=tuple(bench_env(spec)),
            timeout_seconds=probe.timeout_seconds,
        ),
        gpu_strategy=spec.gpu_allocation.strategy if spec.reserves_gpus else "none",
        dra_device_class=spec.gpu_allocation.dra.device_class_name if spec.uses_dra else None,
        privileged_engines=spec.engine == "vllm" and spec.gpu_allocation.strategy == "hostDevices",
        rdma_engines=spec.engine == "vllm" and spec.disaggregated and spec.kv_transfer.backend == "rdma",
        simulated=spec.engine == "simulated",
        model=_model_volume(spec),
        cache=_cache_volume(spec),
        startup_failure_threshold=math.ceil(spec.model_storage.load_timeout_seconds / STARTUP_PROBE_PERIOD_S),
        termination_grace_period_seconds=spec.termination_grace_period_seconds,
        node_selector=spec.effective_node_selector(),
        tolerations=tuple(spec.node.tolerations),
        affinity=dict(spec.node.affinity) if spec.node.affinity else None,
        priority_class_name=spec.node.priority_class_name,
        host_network=spec.host_network,
        credentials=credentials_name(owner),
        replicas=spec.replicas,
        max_unavailable=spec.rollout.max_unavailable,
        pod_template=spec.pod_template,
        metrics_from=tuple(spec.network_policy.metrics_from),
        router_replicas=spec.router.replicas if spec.router.enabled else 0,
        endpoint_picker=spec.inference_pool.endpoint_picker if spec.inference_pool.enabled else None,
    )
