"""Where the serving pod runs and what it mounts: the node, how engines get GPUs (device plugin, host
devices, DRA), the pod template for what the API does not model, and the model and cache volumes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints
from pydantic.alias_generators import to_snake

from pd_operator.api.shared import GROUP, ApiModel, Name, Quantity, SecretKeyRef, Text
from pd_operator.rules import Rule, cel_list

PCI_BUS_ID = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"  # extended BDF, as sysfs and DRA write it


class DraSpec(ApiModel):
    """Dynamic Resource Allocation settings (strategy dra): one ResourceClaimTemplate, one request per engine."""

    device_class_name: Name = Field("gpu.amd.com", description="DeviceClass of the AMD GPU DRA driver.")
    pci_addresses: list[Annotated[str, StringConstraints(max_length=12, pattern=PCI_BUS_ID)]] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "PCI bus addresses (extended BDF, lowercase: 0000:05:00.0) of GPU 0..N-1 of the node, required for "
            "strategy dra: the GPU ranges are indices into this list. Read them from the node's ResourceSlices "
            "(attribute resource.kubernetes.io/pciBusID; gpu.amd.com/pciAddr in older AMD DRA drivers). The "
            "driver publishes no attribute meaning 'GPU index' (cardIndex is the DRM card minor, e.g. 40)."
        ),
    )

    _rules = (
        Rule(
            cel="!has(self.pciAddresses) || self.pciAddresses.all(a, self.pciAddresses.filter(b, b == a).size() == 1)",
            message="pciAddresses must be distinct: each names one GPU",
            check=lambda s: len(set(s.pci_addresses)) == len(s.pci_addresses),
            field_path=".pciAddresses",
        ),
    )


class GpuAllocationSpec(ApiModel):
    """How engine containers get their GPUs (see docs: device plugin, host devices, DRA)."""

    strategy: Literal["devicePlugin", "hostDevices", "dra"] = Field(
        "devicePlugin",
        description=(
            "devicePlugin: amd.com/gpu per container, the plugin picks the devices, no privileged container (default; "
            "Pod Security level in docs/gpu-allocation.md). "
            "hostDevices: exact ranges via privileged containers and CUDA/HIP_VISIBLE_DEVICES while the pod "
            "still requests the node's GPUs for scheduler accounting. dra: a ResourceClaimTemplate pins devices."
        ),
    )
    resource_name: Name = Field("amd.com/gpu", description="Extended resource of the GPU device plugin.")
    dra: DraSpec = Field(default_factory=DraSpec, description="Settings of strategy dra.")


# ---- pod template: what the API does not model -------------------------------------------------------

# Labels and annotations of the serving pod that the operator writes itself (render.labels, the spec hash).
OWNED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
)
OWNED_PREFIX = f"{GROUP}/"
# Volume names the operator renders (dshm-<engine>, models, tmp) and the prefix it keeps for new ones.
OWNED_VOLUMES = ("models", "tmp")
OWNED_VOLUME_PREFIXES = ("dshm-", "pd-")
PROXY_SETTINGS_DIR = "/etc/pd-proxy"  # the proxy's settings ConfigMap (command_lines.proxy_settings)
OWNED_MOUNT_PATHS = ("/dev/shm", "/tmp", PROXY_SETTINGS_DIR)
MAX_TEMPLATE_ENTRIES = 16
LabelMap = dict[str, Text]  # keys are checked by the API server when the pod is created
# Pod fields that the API models elsewhere (or the operator owns), refused in podTemplate: field -> why.
TEMPLATE_REFUSED = {
    "nodeSelector": "use spec.node.nodeSelector",
    "tolerations": "use spec.node.tolerations",
    "affinity": "use spec.node.affinity",
    "priorityClassName": "use spec.node.priorityClassName",
    "hostNetwork": "use spec.kvTransfer.rdma.hostNetwork",
    "terminationGracePeriodSeconds": "use spec.terminationGracePeriodSeconds",
    "securityContext": "the operator sets every security context (docs/gpu-allocation.md)",
    "containers": "the operator renders every container; use the roles' env, extraArgs and resources",
}


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to the serving pod (e.g. k8s.v1.cni.cncf.io/networks for a Multus NIC)."""

    labels: LabelMap = Field(
        default_factory=dict,
        max_length=MAX_TEMPLATE_ENTRIES,
        description="Extra pod labels; the app.kubernetes.io/* labels the operator sets and pd.serving.dev/* are "
        "refused.",
    )
    annotations: LabelMap = Field(
        default_factory=dict,
        max_length=MAX_TEMPLATE_ENTRIES,
        description="Extra pod annotations, e.g. k8s.v1.cni.cncf.io/networks; pd.serving.dev/* are refused. A "
        "change rolls the pod (CNI plugins read annotations when the pod starts).",
    )

    _rules = (
        Rule(
            cel=f"!has(self.labels) || self.labels.all(k, !(k in {cel_list(OWNED_LABELS)}) && "
            f"!k.startsWith('{OWNED_PREFIX}'))",
            message="podTemplate.metadata.labels must not set the labels the operator owns "
            f"({', '.join(OWNED_LABELS)}, {OWNED_PREFIX}*)",
            check=lambda s: all(k not in OWNED_LABELS and not k.startswith(OWNED_PREFIX) for k in s.labels),
            field_path=".labels",
        ),
        Rule(
            cel=f"!has(self.annotations) || self.annotations.all(k, !k.startsWith('{OWNED_PREFIX}'))",
            message=f"podTemplate.metadata.annotations must not set {OWNED_PREFIX}* (the operator's own)",
            check=lambda s: not any(k.startswith(OWNED_PREFIX) for k in s.annotations),
            field_path=".annotations",
        ),
    )


class VolumeMount(ApiModel):
    """A mount of one of podTemplate.volumes, as in a container."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=63)] = Field(
        description="Name of a volume in podTemplate.volumes."
    )
    mount_path: Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")] = Field(
        description="Where it appears in the container; /dev/shm and /tmp are the operator's."
    )
    read_only: bool = Field(False, description="Mount read-only.")
    sub_path: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        None, description="Path inside the volume to mount instead of its root."
    )


def _cel_mounts_ok(mounts: str) -> str:
    """CEL: the mounts at ``mounts`` name declared volumes and stay off the operator's mount paths."""
    return (
        f"(!has({mounts}) || {mounts}.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name) && "
        f"!(m.mountPath in {cel_list(OWNED_MOUNT_PATHS)})))"
    )


class RoleVolumeMounts(ApiModel):
    """Mounts of podTemplate.volumes per role: every engine of the role (all instances) or the proxy."""

    prefill: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_TEMPLATE_ENTRIES, description="Prefill engine containers."
    )
    decode: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_TEMPLATE_ENTRIES, description="Decode engine containers."
    )
    engine: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_TEMPLATE_ENTRIES, description="Colocated engine containers."
    )
    proxy: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_TEMPLATE_ENTRIES, description="The proxy container."
    )

    def of(self, role: str) -> list[VolumeMount]:
        mounts: list[VolumeMount] = getattr(self, role)
        return mounts


_MOUNT_ROLES = tuple(RoleVolumeMounts.model_fields)


def _volume_names(s: PodTemplateSpec) -> list[str]:
    return [str(v.get("name", "")) for v in s.volumes]


def _mounts_ok(s: PodTemplateSpec) -> bool:
    names = set(_volume_names(s))
    mounts = [m for role in _MOUNT_ROLES for m in s.volume_mounts.of(role)]
    return all(m.name in names and m.mount_path not in OWNED_MOUNT_PATHS for m in mounts)


def _named_items(description: str, max_length: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """CRD schema of a list of objects with a required name (the only key CEL rules can read)."""
    name = {"type": "string", "maxLength": max_length, "description": description}
    return {"items": {"type": "object", "required": ["name"], "properties": {"name": name}, **(extra or {})}}


def _template_refuses(field: str, why: str) -> Rule:
    attribute = to_snake(field)
    return Rule(
        cel=f"!has(self.{field})",
        message=f"podTemplate.{field} is refused: {why}",
        check=lambda s: getattr(s, attribute) is None,
        field_path=f".{field}",
    )


def _volume_name_owned(name: str) -> bool:
    return name in OWNED_VOLUMES or name.startswith(OWNED_VOLUME_PREFIXES)


class PodTemplateSpec(ApiModel):
    """What the serving pod gets that the API does not model otherwise (after KServe's template, Dynamo's
    extraPodSpec). Fields the API models elsewhere, or that the operator owns, are refused here, saying where
    they belong."""

    metadata: PodTemplateMetadata = Field(
        default_factory=PodTemplateMetadata, description="Labels and annotations of the serving pod."
    )
    image_pull_secrets: list[dict[str, Name]] = Field(
        default_factory=list,
        max_length=MAX_TEMPLATE_ENTRIES,
        json_schema_extra=_named_items("Secret name.", 253),
        description="Secrets for pulling the images ({name: ...}), for the serving pod and the probe Job.",
    )
    service_account_name: Name | None = Field(
        None,
        description="ServiceAccount of the serving pod (its token is not mounted unless a volume projects it).",
    )
    runtime_class_name: Name | None = Field(None, description="RuntimeClass of the serving pod.")
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=MAX_TEMPLATE_ENTRIES,
        json_schema_extra=_named_items("Volume name.", 63, {"x-kubernetes-preserve-unknown-fields": True}),
        description="Extra pod volumes, as in a Pod spec (name plus one volume source); mount them with "
        "volumeMounts. The names models, tmp, dshm-* and pd-* are the operator's.",
    )
    volume_mounts: RoleVolumeMounts = Field(
        default_factory=RoleVolumeMounts, description="Where each role's containers mount the extra volumes."
    )
    node_selector: dict[str, Any] | None = Field(None, description=f"Refused: {TEMPLATE_REFUSED['nodeSelector']}.")
    tolerations: list[Any] | None = Field(
        None, max_length=64, description=f"Refused: {TEMPLATE_REFUSED['tolerations']}."
    )
    affinity: dict[str, Any] | None = Field(None, description=f"Refused: {TEMPLATE_REFUSED['affinity']}.")
    priority_class_name: Name | None = Field(None, description=f"Refused: {TEMPLATE_REFUSED['priorityClassName']}.")
    host_network: bool | None = Field(None, description=f"Refused: {TEMPLATE_REFUSED['hostNetwork']}.")
    termination_grace_period_seconds: int | None = Field(
        None, description=f"Refused: {TEMPLATE_REFUSED['terminationGracePeriodSeconds']}."
    )
    security_context: dict[str, Any] | None = Field(
        None, description=f"Refused: {TEMPLATE_REFUSED['securityContext']}."
    )
    containers: list[Any] | None = Field(None, max_length=64, description=f"Refused: {TEMPLATE_REFUSED['containers']}.")

    _rules = (
        *(_template_refuses(field, why) for field, why in TEMPLATE_REFUSED.items()),
        Rule(
            cel="!has(self.volumes) || self.volumes.all(v, !(v.name in "
            f"{cel_list(OWNED_VOLUMES)}) && "
            + " && ".join(f"!v.name.startsWith('{p}')" for p in OWNED_VOLUME_PREFIXES)
            + ")",
            message="podTemplate.volumes must not use the operator's volume names (models, tmp, dshm-*, pd-*)",
            check=lambda s: not any(_volume_name_owned(n) for n in _volume_names(s)),
            field_path=".volumes",
        ),
        Rule(
            cel="!has(self.volumeMounts) || ("
            + " && ".join(_cel_mounts_ok(f"self.volumeMounts.{role}") for role in _MOUNT_ROLES)
            + ")",
            message="podTemplate.volumeMounts must name volumes of podTemplate.volumes and must not mount at "
            "/dev/shm or /tmp (the operator's)",
            check=_mounts_ok,
            field_path=".volumeMounts",
        ),
    )


# Where engine vllm lands when node.nodeSelector is unset (PDDeploymentSpec.effective_node_selector).
MI300X_NODE_SELECTOR = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}


class NodeSpec(ApiModel):
    """The node the pod lands on: its size (for admission checks) and placement."""

    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs of the node; every GPU range must lie inside it.")
    node_selector: dict[str, Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        None,
        max_length=16,
        description=(
            "Node labels the pod requires. Unset: the MI300X product label "
            "(amd.com/gpu.product-name=AMD_Instinct_MI300X_OAM) for engine vllm, none for engine simulated."
        ),
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        description="Pod tolerations, as in a Pod spec.",
    )
    affinity: dict[str, Any] | None = Field(
        None,
        json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        description="Pod affinity, as in a Pod spec.",
    )
    priority_class_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None, description="PriorityClass of the pod."
    )


# A volume from a claim or from a node directory, never both (model weights, engine caches).
_ONE_VOLUME_SOURCE = Rule(
    cel="!(has(self.persistentVolumeClaim) && has(self.hostPath))",
    message="set at most one of persistentVolumeClaim and hostPath",
    check=lambda s: not (s.persistent_volume_claim and s.host_path),
)


class ModelStorageSpec(ApiModel):
    """Where weights come from and how long loading may take."""

    persistent_volume_claim: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None, description="PVC holding the Hugging Face cache (mounted at mountPath)."
    )
    host_path: Annotated[str, StringConstraints(max_length=1024, pattern=r"^/")] | None = Field(
        None, description="Node-local cache directory (mounted at mountPath)."
    )
    mount_path: Annotated[str, StringConstraints(max_length=1024, pattern=r"^/")] = Field(
        "/models", description="Mount point inside engine containers; HF_HOME points here when a volume is set."
    )
    read_only: bool = Field(False, description="Mount the weights read-only (the cache must be complete).")
    hub_token_secret: SecretKeyRef | None = Field(
        None, description="Secret with a Hugging Face token, passed as HF_TOKEN."
    )
    load_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=86400,
        description=(
            "Budget for downloading and loading the model: sizes the startup probe (failureThreshold = "
            "budget / 10 s) and VLLM_ENGINE_READY_TIMEOUT_S. A 235B model takes many minutes."
        ),
    )

    _rules = (_ONE_VOLUME_SOURCE,)


class CacheStorageSpec(ApiModel):
    """Where the engines' compile and JIT caches live, so a restarted engine does not rebuild them."""

    persistent_volume_claim: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None, description="PVC for the caches: they survive the pod too (a new pod, another node with the same PVC)."
    )
    host_path: Annotated[str, StringConstraints(max_length=1024, pattern=r"^/")] | None = Field(
        None, description="Node directory for the caches: they survive the pod on that node."
    )
    size_limit: Quantity = Field(
        "32Gi",
        description="sizeLimit of the default emptyDir, which survives container restarts but not the pod.",
    )
    mount_path: Annotated[str, StringConstraints(max_length=1024, pattern=r"^/")] = Field(
        "/var/cache/pd",
        description=(
            "Mount point in the engine containers; each engine uses <mountPath>/<container>/ for VLLM_CACHE_ROOT "
            "(vllm/, torch.compile and its Inductor/Triton output), TRITON_CACHE_DIR (triton/), MORI_JIT_CACHE_DIR "
            "(mori/) and AITER_JIT_DIR (aiter-<image digest>/, seeded with the image's prebuilt AITER modules)."
        ),
    )

    _rules = (_ONE_VOLUME_SOURCE,)
