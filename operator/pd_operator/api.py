"""The PDDeployment API (pd.serving.dev/v1alpha1) as pydantic models: the single source of truth.

The CRD (crd.py), its documentation (docs/crd-reference.md) and the offline validation of
``pdctl render`` are all generated from these classes. Every field carries a description, because it
becomes what ``kubectl explain pdd.spec...`` prints. Cross-field rules live next to the model they
constrain as :class:`~pd_operator.rules.Rule` objects (CEL for the API server, Python for pydantic,
one message); see ``_rules`` on each class.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel, to_snake
from pydantic_core import PydanticCustomError

from pd_operator.rules import (
    GPU_RANGE_MAX_LENGTH,
    Rule,
    cel_count,
    cel_first,
    cel_last,
    cel_list,
    cel_range_ok,
    cel_ranges_disjoint,
    gpu_count,
    parse_gpu_range,
    ranges_disjoint,
    violations,
)
from pd_operator.vllm_flags import (
    MANAGED_FLAGS,
    cel_names_flag,
    cel_sets_compilation_config,
    names_flag,
    sets_compilation_config,
)
from pd_runtime import protocol

GROUP = "pd.serving.dev"
VERSION = "v1alpha1"
KIND = "PDDeployment"
PLURAL = "pddeployments"
SINGULAR = "pddeployment"
SHORT_NAME = "pdd"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = "ghcr.io/pd-serving/pd-runtime:0.1.0"
DEFAULT_PROXY_PORT = 8000
DEFAULT_ADMIN_PORT = 8001
MI300X_NODE_SELECTOR = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
RUN_PROBE_ANNOTATION = f"{GROUP}/run-goodput-probe"
# Engines per role in one pod (xPyD); with one proxy, 8 GPUs and TP >= 1 more never fit a node.
MAX_ROLE_INSTANCES = 8
MAX_REPLICAS = 64

Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Text = Annotated[str, StringConstraints(max_length=1024)]
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?$")]
GpuRange = Annotated[str, StringConstraints(min_length=1, max_length=GPU_RANGE_MAX_LENGTH)]
Port = Annotated[int, Field(ge=1, le=65535)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
Timestamp = Annotated[str, StringConstraints(max_length=64)]

# Variables the operator renders itself; setting them through env would fight it (flags: vllm_flags).
MANAGED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "POD_IP",
    "VLLM_HOST_IP",
    # Ignored (with a deprecation warning) since vLLM 0.29; kvTransfer.transferMode renders read_mode.
    "VLLM_MORIIO_CONNECTOR_READ_MODE",
    "VLLM_ENGINE_READY_TIMEOUT_S",
)
# Linux's default net.ipv4.ip_local_port_range: where the kernel picks a port for bind(port 0), which
# is how vLLM's get_open_port() draws the ports of its other listeners (MoRI engine, side channels).
EPHEMERAL_PORTS = (32768, 60999)
# num_attention_heads of each model's config.json on Hugging Face: tensorParallelSize must divide it.
KNOWN_ATTENTION_HEADS = {
    "Qwen/Qwen3-235B-A22B": 64,
    "Qwen/Qwen3-235B-A22B-FP8": 64,
    "Qwen/Qwen3-30B-A3B": 32,
    "Qwen/Qwen3-8B": 32,
    "Qwen/Qwen3-0.6B": 16,
    "meta-llama/Llama-3.1-8B-Instruct": 32,
    "meta-llama/Llama-3.1-70B-Instruct": 64,
    "deepseek-ai/DeepSeek-R1": 128,
    "deepseek-ai/DeepSeek-V3": 128,
}


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields rejected, CEL rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=False,
    )
    _rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        failed = violations(type(self)._rules, self)
        if failed:
            raise PydanticCustomError(
                "spec_rule",
                "{summary}",
                {"summary": "; ".join(v.message for v in failed), "violations": failed},
            )
        return self


# ---- engines ------------------------------------------------------------------------------------


class EnvVar(ApiModel):
    """An environment variable for an engine container (literal value)."""

    name: EnvName = Field(description="Variable name.")
    value: Text = Field("", description="Literal value.")


class Resources(ApiModel):
    """Compute resources of a container, as in a Pod (GPU and RDMA resources are added by the operator)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Minimum resources, e.g. cpu: 16, memory: 256Gi; each key given replaces the operator's default "
            "(engines: 4 CPUs and 16Gi plus /dev/shm per GPU; proxy: cpu 500m, memory 256Mi)."
        ),
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Maximum resources. Memory-backed /dev/shm counts against the memory limit. The proxy defaults to "
            "cpu 2, memory 1Gi; engines have no CPU or memory limit unless qosClass is Guaranteed."
        ),
    )


def _role_count_check(role: EngineSettings) -> bool:
    bounds = parse_gpu_range(role.gpus)
    return bounds is None or gpu_count(role.gpus) == role.tensor_parallel_size * role.data_parallel_size


_GPUS_WELL_FORMED = Rule(
    cel=cel_range_ok("self.gpus"),
    message='gpus must be a GPU index or an inclusive range like "0-3" (first <= last)',
    check=lambda s: parse_gpu_range(s.gpus) is not None,
    field_path=".gpus",
)
_GPUS_MATCH_PARALLELISM = Rule(
    cel=f"!{cel_range_ok('self.gpus')} || {cel_count('self.gpus')} == self.tensorParallelSize * self.dataParallelSize",
    message="gpus must contain exactly tensorParallelSize * dataParallelSize GPUs",
    check=_role_count_check,
    field_path=".gpus",
)
_ARGS_AND_ENV_RULES = (
    Rule(
        cel=f"!has(self.extraArgs) || !self.extraArgs.exists(a, {cel_names_flag('a', MANAGED_FLAGS)})",
        message="extraArgs must not set flags the operator renders (--port, -tp, --data-parallel-size, "
        "--kv-transfer-config, --served-model-name), in any spelling vLLM reads as them (underscores, "
        "a prefix, --flag.key=value): use their fields",
        check=lambda s: not any(names_flag(a, MANAGED_FLAGS) for a in s.extra_args),
        field_path=".extraArgs",
    ),
    Rule(
        cel=f"!has(self.env) || self.env.all(e, !(e.name in {cel_list(MANAGED_ENV)}))",
        message="env must not set variables the operator manages (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, "
        "ROCR_VISIBLE_DEVICES, POD_IP, VLLM_HOST_IP, VLLM_MORIIO_CONNECTOR_READ_MODE, "
        "VLLM_ENGINE_READY_TIMEOUT_S)",
        check=lambda s: all(e.name not in MANAGED_ENV for e in s.env),
        field_path=".env",
    ),
)


class EngineSettings(ApiModel):
    """What every vLLM engine of the deployment shares: GPUs, parallelism, batching, extra args."""

    gpus: GpuRange = Field(
        description=(
            'GPU indices for this engine: one index ("5") or an inclusive range ("0-3"). With '
            "gpuAllocation.strategy devicePlugin only the count matters (the plugin picks the devices); "
            "hostDevices and dra pin exactly these indices."
        )
    )
    tensor_parallel_size: int = Field(4, ge=1, le=64, description="vLLM -tp: GPUs one model replica spans.")
    data_parallel_size: int = Field(
        1, ge=1, le=64, description="vLLM --data-parallel-size: replicas inside this engine (rendered when > 1)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=1048576, description="vLLM --max-num-batched-tokens: token budget of one scheduler step."
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=65536, description="vLLM --max_num_seqs: sequences running at once; unset = vLLM default."
    )
    max_model_len: int | None = Field(
        None, ge=1, le=10485760, description="vLLM --max-model-len: context length; unset = the model's."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="vLLM --gpu_memory_utilization: fraction of GPU memory vLLM may use."
    )
    enable_expert_parallel: bool = Field(
        False, description="vLLM --enable-expert-parallel (MoE models such as Qwen3-235B-A22B)."
    )
    enable_prefix_caching: bool = Field(
        False,
        description=(
            "vLLM prefix caching. false renders --no-enable-prefix-caching, which the MoRI-IO connector "
            "needed as of 2026-04; true renders --enable-prefix-caching."
        ),
    )
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "More `vllm serve` arguments, appended verbatim. Flags the operator renders itself (--port, -tp, "
            "--kv-transfer-config, ...) are refused in every spelling vLLM reads as them (--tensor_parallel-size, "
            "--tensor-par, --kv-transfer-config.kv_role=...)."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=(
            "Extra environment variables; a name the operator also sets (e.g. VLLM_ROCM_USE_AITER) replaces "
            "its value. GPU visibility and advertised-address variables are refused."
        ),
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="CPU and memory of the container; GPUs and RDMA devices are added by the operator.",
    )
    shm_size: Quantity = Field(
        "32Gi", description="Size of the memory-backed /dev/shm emptyDir (tensor-parallel workers share memory)."
    )

    _rules: ClassVar[tuple[Rule, ...]] = (_GPUS_WELL_FORMED, _GPUS_MATCH_PARALLELISM, *_ARGS_AND_ENV_RULES)

    @property
    def rank_port_span(self) -> int:
        """Ports each per-rank listener (handshake, notify) takes from its base.

        vLLM 0.29's MoRI-IO connector binds rank (dp, tp) at ``base + dp_rank + tp_rank``
        (``get_port_offset`` with its default tp_size of 1), so the highest port is
        base + (dp - 1) + (tp - 1).
        """
        return self.tensor_parallel_size + self.data_parallel_size - 1

    @model_validator(mode="after")
    def _unique_env(self) -> EngineSettings:
        names = [e.name for e in self.env]
        if len(names) != len(set(names)):
            raise PydanticCustomError("duplicate_env", "Duplicate value: env names must be unique")
        return self


_HTTP_PORT_DOC = (
    "vLLM --port and http_port of kv_connector_extra_config. vLLM binds it at start-up; with hostNetwork "
    "prefer a port outside the ephemeral range 32768-60999 (docs/gpu-allocation.md)."
)
_HANDSHAKE_PORT_DOC = (
    "handshake_port base (MoRI-IO metadata exchange). Each rank binds base + dp rank + tp rank, i.e. "
    "tensorParallelSize + dataParallelSize - 1 ports; engine vllm refuses ranges in 32768-60999."
)
_NOTIFY_PORT_DOC = "notify_port base (KV-transfer completion messages); per-rank ports like handshake."


class RolePorts(ApiModel):
    """Base ports of one engine; each rank's handshake and notify listener binds base + dp rank + tp rank."""

    http: Port = Field(description=_HTTP_PORT_DOC)
    handshake: Port = Field(description=_HANDSHAKE_PORT_DOC)
    notify: Port = Field(description=_NOTIFY_PORT_DOC)


class PrefillPorts(RolePorts):
    """Prefill ports; defaults are the seed experiment's (20005, 6301, 6105)."""

    http: Port = Field(protocol.PREFILL_PORTS.http, description=_HTTP_PORT_DOC)
    handshake: Port = Field(protocol.PREFILL_PORTS.handshake, description=_HANDSHAKE_PORT_DOC)
    notify: Port = Field(protocol.PREFILL_PORTS.notify, description=_NOTIFY_PORT_DOC)


class DecodePorts(RolePorts):
    """Decode ports; defaults are the seed experiment's (40005, 7301, 7501)."""

    http: Port = Field(protocol.DECODE_PORTS.http, description=_HTTP_PORT_DOC)
    handshake: Port = Field(protocol.DECODE_PORTS.handshake, description=_HANDSHAKE_PORT_DOC)
    notify: Port = Field(protocol.DECODE_PORTS.notify, description=_NOTIFY_PORT_DOC)


class EngineInstanceSpec(ApiModel):
    """One engine of a role that runs several (xPyD in one pod): its own GPUs and base ports."""

    gpus: GpuRange = Field(
        description='GPU indices of this engine ("0-1"): exactly tensorParallelSize * dataParallelSize of its role.'
    )
    ports: RolePorts = Field(
        description="Base ports of this engine; with the other engines' ports and rank offsets they must not overlap."
    )

    _rules = (_GPUS_WELL_FORMED,)


def _instances_match_parallelism(role: DisaggregatedRoleSpec) -> bool:
    width = role.tensor_parallel_size * role.data_parallel_size
    return all(parse_gpu_range(i.gpus) is None or gpu_count(i.gpus) == width for i in role.instances)


def cel_has_instances(role: str) -> str:
    """CEL: the role at ``role`` (e.g. ``self.prefill``) lists its engines in ``instances``."""
    return f"(has({role}.instances) && size({role}.instances) > 0)"


class DisaggregatedRoleSpec(EngineSettings):
    """A prefill or decode role: one engine (gpus, ports) or several (instances), all with the same settings."""

    ports: RolePorts = Field(description="Listening ports of the engine.")
    instances: list[EngineInstanceSpec] = Field(
        default_factory=list,
        max_length=MAX_ROLE_INSTANCES,
        description=(
            "Several engines of this role in the pod (xPyD), each its own container (<role>-0, <role>-1, ...) "
            "with its own GPUs and ports, every one registering with the proxy; they share every other "
            "setting of the role. Empty: one engine (container <role>) on gpus and ports, which are then "
            "the only ones used; when set, gpus and ports of the role are ignored."
        ),
    )

    _rules = (
        _GPUS_WELL_FORMED,
        Rule(
            cel=f"{cel_has_instances('self')} || {_GPUS_MATCH_PARALLELISM.cel}",
            message=_GPUS_MATCH_PARALLELISM.message,
            check=lambda s: bool(s.instances) or _role_count_check(s),
            field_path=".gpus",
        ),
        Rule(
            cel=f"!has(self.instances) || self.instances.all(i, !{cel_range_ok('i.gpus')} || "
            f"{cel_count('i.gpus')} == self.tensorParallelSize * self.dataParallelSize)",
            message="instances[*].gpus must each contain exactly tensorParallelSize * dataParallelSize GPUs",
            check=_instances_match_parallelism,
            field_path=".instances",
        ),
        *_ARGS_AND_ENV_RULES,
    )

    def engine_instances(self) -> list[tuple[str, RolePorts]]:
        """(GPU range, base ports) of every engine of the role, in container order."""
        if not self.instances:
            return [(self.gpus, self.ports)]
        return [(i.gpus, i.ports) for i in self.instances]


class PrefillSpec(DisaggregatedRoleSpec):
    """The prefill engine(s) (kv_producer), in disaggregated mode."""

    gpus: GpuRange = Field("0-3", description=EngineSettings.model_fields["gpus"].description)
    ports: PrefillPorts = Field(default_factory=PrefillPorts, description="Listening ports of the prefill engine.")


class DecodeSpec(DisaggregatedRoleSpec):
    """The decode engine(s) (kv_consumer), in disaggregated mode."""

    gpus: GpuRange = Field("4-7", description=EngineSettings.model_fields["gpus"].description)
    ports: DecodePorts = Field(default_factory=DecodePorts, description="Listening ports of the decode engine.")


class ColocatedEngineSpec(EngineSettings):
    """One standard (non-disaggregated) engine, prefill and decode mixed, behind the round-robin proxy."""

    port: Port = Field(description="vLLM --port of this engine.")


def _default_colocated_engines() -> list[ColocatedEngineSpec]:
    """The seed's standard-serving baseline: two TP4 engines on GPUs 0-3 and 4-7, ports 8100 and 8200."""
    return [ColocatedEngineSpec(gpus="0-3", port=8100), ColocatedEngineSpec(gpus="4-7", port=8200)]


class ColocatedSpec(ApiModel):
    """Settings of mode colocated (the seed's baseline): one or two engines, named engine-0 and engine-1."""

    engines: list[ColocatedEngineSpec] = Field(
        default_factory=_default_colocated_engines,
        min_length=1,
        max_length=2,
        description='Engines; two TP4 engines ("0-3", "4-7") by default, or one TP8 engine ("0-7").',
    )


# ---- KV transfer, GPUs, node --------------------------------------------------------------------


class RdmaSpec(ApiModel):
    """How the engines reach an RDMA NIC for MoRI-IO (needed even on one node: KV moves by NIC loopback)."""

    resource_name: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        None,
        description=(
            "Extended resource that mounts /dev/infiniband, e.g. rdma/hca_shared_devices_a "
            "(Mellanox shared-device plugin) or amd.com/nic (AMD network operator). Required for engine "
            "vllm with backend rdma, except with gpuAllocation.strategy hostDevices (privileged containers "
            "see every host device)."
        ),
    )
    resource_count: int = Field(1, ge=1, le=16, description="How many of resourceName each engine requests.")
    host_network: bool = Field(
        False,
        description=(
            "Run the pod in the host network namespace, where RoCE GIDs live (the least risky choice for "
            "single-node loopback). An addition to resourceName, never a substitute: a network namespace "
            "brings no /dev/infiniband. NetworkPolicies do not apply to host-network pods."
        ),
    )


class KVTransferSpec(ApiModel):
    """The KV-cache connector between prefill and decode (disaggregated mode only)."""

    connector: Literal["MoRIIOConnector"] = Field("MoRIIOConnector", description="vLLM kv_connector.")
    transfer_mode: Literal["write", "read"] = Field(
        "write",
        description=(
            "write: prefill pushes KV layer by layer while decode waits (default, slightly better TTFT); "
            "read: the proxy waits for prefill and decode pulls the blocks."
        ),
    )
    backend: Literal["rdma", "xgmi"] = Field(
        "rdma",
        description=(
            "MoRI-IO backend: rdma (default, through the NIC even on one node) or xgmi (experimental; needs "
            "every GPU visible to both containers, i.e. gpuAllocation.strategy hostDevices)."
        ),
    )
    transfer_timeout_seconds: float = Field(
        protocol.DEFAULT_TRANSFER_TIMEOUT_S,
        gt=0,
        le=3600,
        description="transfer_timeout: seconds to wait for an RDMA completion or handshake.",
    )
    defer_timeout_seconds: float = Field(
        protocol.DEFAULT_DEFER_TIMEOUT_S,
        gt=0,
        le=86400,
        description="defer_timeout: seconds before un-acknowledged KV blocks held for a peer are freed.",
    )
    rdma: RdmaSpec = Field(default_factory=RdmaSpec, description="NIC access for backend rdma.")

    _rules = (
        Rule(
            cel="self.deferTimeoutSeconds >= self.transferTimeoutSeconds",
            message="deferTimeoutSeconds must be >= transferTimeoutSeconds",
            check=lambda s: s.defer_timeout_seconds >= s.transfer_timeout_seconds,
            field_path=".deferTimeoutSeconds",
        ),
    )


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


# Who may scrape the serving pods' metrics by default: Prometheus pods (kube-prometheus-stack labels them so)
# in the namespace named monitoring (every namespace carries its kubernetes.io/metadata.name label).
DEFAULT_METRICS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _default_metrics_peers() -> list[dict[str, Any]]:
    return [dict(DEFAULT_METRICS_PEER)]


class NetworkPolicySpec(ApiModel):
    """What the serving pod's NetworkPolicy admits beyond the API port, the operator and the pod itself."""

    metrics_from: list[dict[str, Any]] = Field(
        default_factory=_default_metrics_peers,
        max_length=8,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        description=(
            "NetworkPolicy peers (namespaceSelector, podSelector, ipBlock, as in a NetworkPolicy's from) that "
            "may scrape metrics: every engine's vLLM /metrics on its HTTP port and the proxy's /metrics on its "
            "admin port. Default: pods labelled app.kubernetes.io/name=prometheus in the namespace monitoring; "
            "[] admits no scraper."
        ),
    )


class EndpointPickerSpec(ApiModel):
    """The endpoint picker (EPP) a gateway asks which pool member serves each request."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        description="Its Service in this namespace (deployed by you, e.g. the inference extension's reference EPP)."
    )
    port: int = Field(
        ge=1, le=65535, description="The Service port of its ext-proc gRPC API (9002 in the EPP's chart)."
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        "FailClose",
        description="What the gateway does when the picker does not answer: FailClose refuses the request, "
        "FailOpen sends it to any pool member.",
    )


class InferencePoolSpec(ApiModel):
    """A Gateway API Inference Extension InferencePool over the serving pods, for users of that ecosystem."""

    _rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!self.enabled || has(self.endpointPicker)",
            message="inferencePool.endpointPicker is required when inferencePool.enabled is true",
            check=lambda s: not s.enabled or s.endpoint_picker is not None,
            field_path=".endpointPicker",
        ),
    )

    enabled: bool = Field(
        False,
        description=(
            "Render an InferencePool NAME (inference.networking.k8s.io/v1, Gateway API Inference Extension v1.0) "
            "whose members are this PDDeployment's serving pods on the proxy's API port, so an HTTPRoute can "
            "send a gateway's traffic to it. The cluster must serve the InferencePool CRD (else the condition "
            "ChildrenAdmitted says so and serving goes on). Disabling deletes it."
        ),
    )
    endpoint_picker: EndpointPickerSpec | None = Field(
        None, description="The endpoint picker the pool names (required when enabled)."
    )


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
PROXY_SETTINGS_DIR = "/etc/pd-proxy"  # the proxy's settings ConfigMap (engine_cmd.proxy_settings)
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


class RolloutSpec(ApiModel):
    """How a spec change and a node drain reach the replicas."""

    max_unavailable: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "With replicas > 1: at most this many replicas out of service at a time. A spec change rolls that "
            "many pods at once (delete, then create: a pod holds its node's GPUs, so there is no surge) and "
            "waits for each new one to be Ready and KVTransferVerified before the next; the PodDisruptionBudget "
            "keeps replicas - maxUnavailable serving during node drains. With replicas 1 a spec change deletes "
            "and recreates the one pod (an outage of one pod start) and no PodDisruptionBudget is rendered."
        ),
    )


class RouterSpec(ApiModel):
    """The router: one address in front of every replica's proxy (`pdctl proxy --router`)."""

    enabled: bool = Field(
        False,
        description=(
            "Render a Deployment NAME-router running `pdctl proxy --router` (pods spread across nodes where "
            "possible), its Service NAME-router (API port only), a NetworkPolicy, a PodDisruptionBudget "
            "(maxUnavailable 1, with more than one pod) and a ServiceAccount allowed to watch this namespace's "
            "EndpointSlices. It sends each request "
            "to the least loaded ready replica (in-flight requests, own and reported by the replica's admin "
            "/status) instead of the Service's connection-level spreading. Disabling deletes them."
        ),
    )
    replicas: int = Field(2, ge=1, le=16, description="Router pods (stateless; two survive the loss of one).")


# ---- model storage, proxy, simulation, probe -------------------------------------------------------


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: Name = Field(description="Secret name.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field("token", description="Key.")


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


class ProxyTimeouts(ApiModel):
    """Proxy timeouts in seconds; unset ones keep the proxy's defaults (which never cut a healthy stream)."""

    connect_seconds: float | None = Field(None, gt=0, le=3600, description="Connecting to an engine.")
    prefill_seconds: float | None = Field(None, gt=0, le=86400, description="Whole prefill leg.")
    decode_first_byte_seconds: float | None = Field(
        None, gt=0, le=86400, description="Until the decode leg's first byte."
    )
    kv_wait_seconds: float | None = Field(
        None,
        gt=0,
        le=86400,
        description=(
            "Streaming decode: until its first byte, counted from prefill's answer; then both legs are aborted "
            "(a dropped KV transfer). Unset = kvTransfer.deferTimeoutSeconds + kvTransfer.transferTimeoutSeconds "
            f"(divided by simulation.timeScale for engine simulated) + {protocol.KV_WAIT_MARGIN_S:g} s for notifies, "
            "a decode step and HTTP; "
            "a larger value is refused."
        ),
    )
    idle_seconds: float | None = Field(None, gt=0, le=86400, description="Longest gap between streamed chunks.")
    response_seconds: float | None = Field(None, gt=0, le=86400, description="Whole non-streaming decode answer.")


class ProxyAdmission(ApiModel):
    """How many client requests the proxy serves at once, and how the rest wait (reloaded: no restart)."""

    max_in_flight: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description=(
            "Most client requests the proxy serves at once (the canary is not counted); past it requests wait "
            "in the admission queue, then get 429 with Retry-After. 0 = no limit."
        ),
    )
    max_queued: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description=(
            "Requests past maxInFlight wait in a FIFO queue of at most this many, served in arrival order as "
            "slots free; a request finding it full gets 429 with Retry-After (when the queue ahead should have "
            "drained, from how long requests hold a slot). 0 = refused at once. Needs maxInFlight > 0."
        ),
    )
    queue_timeout_seconds: float = Field(
        30,
        gt=0,
        le=3600,
        description="Longest wait in the admission queue; then 429 with Retry-After.",
    )

    _rules = (
        Rule(
            cel="!has(self.maxQueued) || self.maxQueued == 0 || (has(self.maxInFlight) && self.maxInFlight > 0)",
            message="admission.maxQueued needs admission.maxInFlight > 0: without a limit no request ever waits",
            check=lambda s: s.max_queued == 0 or s.max_in_flight > 0,
            field_path=".maxQueued",
        ),
    )


class ProxyPrefixAffinity(ApiModel):
    """policy prefix_affinity: which part of the prompt places it, and when load wins over the cache."""

    prefix_tokens: int = Field(
        64,
        ge=1,
        le=65536,
        description=(
            "The prompt's first this many tokens choose its prefill engine (a consistent-hash ring of them); "
            "the proxy has no tokenizer, so for a text prompt or chat messages 4 characters count as a token. "
            "At most the length of the prefix your prompts share (a system prompt), or they spread at random."
        ),
    )
    max_imbalance: int = Field(
        4,
        ge=0,
        le=100000,
        description=(
            "The prompt's prefill engine is passed over for the least loaded one while it has more than this "
            "many requests more (or its KV cache is nearly full): a cache miss costs one prefill, a queue behind "
            "a hot prefix every request in it."
        ),
    )


class ProxySpec(ApiModel):
    """The proxy: the only component clients talk to."""

    port: Port = Field(DEFAULT_PROXY_PORT, description="OpenAI API port, the only port the Service exposes.")
    admin_port: Port = Field(
        DEFAULT_ADMIN_PORT, description="Admin port (/status, /metrics); reachable only from the operator."
    )
    registration_port: Port = Field(
        protocol.REGISTRATION_PORT,
        description="ZMQ registration (proxy_ping_port); bound to 127.0.0.1 inside the pod.",
    )
    policy: Literal["round_robin", "least_outstanding", "least_load", "prefix_affinity"] = Field(
        "round_robin",
        description=(
            "How the proxy picks engines (and DP ranks): round_robin; least_outstanding (fewest requests in "
            "flight from the proxy); least_load (each engine's own queue depth and KV-cache usage, scraped from "
            "its vLLM /metrics every second, for several engines per role); prefix_affinity (for several "
            "prefill engines: prompts that begin alike go to the same prefill engine, for its prefix cache, "
            "unless it is saturated, see prefixAffinity; decode by least_load). Decode never gets more than "
            "decode.maxNumSeqs in flight per DP rank under any policy."
        ),
    )
    prefix_affinity: ProxyPrefixAffinity = Field(
        default_factory=ProxyPrefixAffinity,
        description="Settings of policy prefix_affinity (reloaded: no restart).",
    )
    heartbeat_ttl_seconds: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="Registration TTL; unset = ten heartbeat intervals (30 s; vLLM < 0.32 may miss beats under load).",
    )
    no_kv_fallback: Literal["prefill", "error"] = Field(
        "prefill",
        description=(
            "When prefill answers without usable KV for decode (an aborted prefill; its min_tokens: 1 keeps EOS "
            "and stop strings from ending it): prefill = serve the request on the prefill engine as a plain "
            "request, error = answer 502. Never decode, which vLLM < 0.32/0.33 would hang."
        ),
    )
    timeouts: ProxyTimeouts = Field(default_factory=ProxyTimeouts, description="Upstream timeouts.")
    admission: ProxyAdmission = Field(
        default_factory=ProxyAdmission,
        description="A limit on client requests served at once, with a bounded FIFO queue and 429 past it.",
    )
    canary_interval_seconds: float = Field(
        300,
        ge=0,
        le=86400,
        description=(
            "Disaggregated mode: seconds between the proxy's canary requests, which keep KVTransferVerified "
            "meaningful without user traffic: a greedy request through prefill and decode whose tokens must "
            "equal the prefill engine's own for the same request (False with reason KVMismatch when not); it "
            "also runs at start and whenever the routable engines change; 0 disables the canary."
        ),
    )
    on_kv_mismatch: Literal["report", "stopServing"] = Field(
        "report",
        description=(
            "When the canary finds decode's tokens after a KV transfer differ from prefill's own (wrong KV "
            "reached decode): report = KVTransferVerified False (KVMismatch), a Warning Event and the proxy's "
            "pd_proxy_kv_canary_total; stopServing = also make the proxy answer 503 and fail its readiness, so "
            "the Service stops sending it traffic, until the pod is replaced or this is set back to report "
            "(no restart: the proxy reloads it). Needs the canary (canaryIntervalSeconds > 0)."
        ),
    )
    otlp_traces_endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        max_length=2048,
        description=(
            "The proxy's own OpenTelemetry spans (one per request, parented to the client's traceparent, and "
            "one per leg, whose context the leg carries to the engines) sent over OTLP/HTTP to this URL, e.g. "
            "http://otel-collector.observability:4318/v1/traces; unset: none. The engines export their own "
            "spans with vLLM's --otlp-traces-endpoint (extraArgs)."
        ),
    )
    api_key_secret: SecretKeyRef | None = Field(
        None, description="Secret whose value clients must send as a bearer token (and the probe uses)."
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Type of the Service in front of the proxy."
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of the proxy.")
    extra_args: list[Arg] = Field(
        default_factory=list, max_length=32, description="More `pdctl proxy` arguments, appended verbatim."
    )

    _rules = (
        Rule(
            cel="!has(self.onKvMismatch) || self.onKvMismatch != 'stopServing' || "
            "!has(self.canaryIntervalSeconds) || self.canaryIntervalSeconds > 0",
            message="onKvMismatch stopServing needs the canary: canaryIntervalSeconds must be > 0",
            check=lambda s: s.on_kv_mismatch != "stopServing" or s.canary_interval_seconds > 0,
            field_path=".onKvMismatch",
        ),
    )


class SimulationSpec(ApiModel):
    """Settings of engine simulated (CPU-only engines speaking vLLM's HTTP API and the MoRI-IO protocol)."""

    profile: Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")] = Field(
        "instant", description="Timing profile: instant, or qwen3-235b-mi300x (the seed's experiment)."
    )
    time_scale: float = Field(1.0, gt=0, le=10000, description="Run every modelled duration this many times faster.")
    reserve_gpus: bool = Field(
        False,
        description="Request GPU and RDMA resources as engine vllm would (to exercise scheduling on a GPU node).",
    )


class SloSpec(ApiModel):
    """A request is good when both its TTFT and its ITL are within bounds (the seed: 1 s and 50 ms)."""

    ttft_ms: float = Field(1000.0, gt=0, le=3.6e6, description="Time to first token bound, ms.")
    itl_ms: float = Field(50.0, gt=0, le=3.6e6, description="Per-request mean inter-token latency bound, ms.")
    target: float = Field(0.9, gt=0, le=1, description="Attainment (fraction of good requests) that counts as met.")


class GoodputProbeSpec(ApiModel):
    """Periodic goodput probes: a Job runs `pdctl bench` against the Service and the result lands in status."""

    enabled: bool = Field(False, description="Run probes once Ready, every intervalSeconds and on demand.")
    rate: float = Field(8.0, gt=0, le=10000, description="Request rate, requests per second (seed: 8).")
    requests: int = Field(100, ge=1, le=100000, description="Requests per probe (seed: 100).")
    prompt_tokens: int = Field(2000, ge=1, le=1048576, description="Prompt length in tokens (seed: 2000).")
    output_tokens: int = Field(1000, ge=1, le=1048576, description="Output length in tokens (seed: 1000).")
    slo: SloSpec = Field(default_factory=SloSpec, description="Latency SLO and attainment target.")
    search: bool = Field(False, description="Also search the highest rate meeting the target (goodput rate).")
    ignore_eos: bool = Field(
        True,
        description="Every reply has exactly outputTokens tokens; false: replies end at the model's EOS (at most "
        "outputTokens), as the seed's `vllm bench serve` without --ignore-eos (`pdctl bench --no-ignore-eos`).",
    )
    interval_seconds: int = Field(3600, ge=60, le=604800, description="Seconds between periodic probes.")
    timeout_seconds: int = Field(1800, ge=30, le=86400, description="activeDeadlineSeconds of the probe Job.")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Random seed of the arrivals and prompts.")


class AutotuneSpec(ApiModel):
    """Live autotuning: the operator tries the planner's best layouts for the probe's workload and keeps the best.

    Each trial serves with one layout (the pod rolls as on a spec change) and measures it with one goodput
    probe; the result is in status.autotune. `pdctl autotune accept NAME` writes the tuned layout into the spec.
    """

    enabled: bool = Field(
        False, description="Try layouts for the goodputProbe workload (needs goodputProbe.enabled and replicas 1)."
    )
    max_trials: int = Field(
        3,
        ge=1,
        le=8,
        description="Layouts to try: the planner's best, and with 2 or more the best of the other kind "
        "(colocated or disaggregated) among them.",
    )


class AutoscalingSpec(ApiModel):
    """Replicas from demand against measured capacity: the operator writes spec.replicas itself.

    Capacity is the highest request rate one replica holds within the goodput probe's SLO (its last
    goodput search, else the planner's prediction); demand is the request rate the replicas' proxies
    see. Desired replicas = ceil(demand / (targetUtilization x capacity)), held by stabilization windows
    as a HorizontalPodAutoscaler holds its recommendations. docs/autoscaling.md.
    """

    _rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
    )

    enabled: bool = Field(
        False,
        description="Set spec.replicas from demand against capacity (not with a HorizontalPodAutoscaler on this "
        "object: one owner of replicas; with one, the operator only publishes capacity and demand).",
    )
    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Fewest replicas (scale to zero: not yet).")
    max_replicas: int = Field(4, ge=1, le=MAX_REPLICAS, description="Most replicas (GPU nodes it may take).")
    target_utilization: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Fraction of each replica's capacity to plan for: demand / (this x capacity) replicas.",
    )
    scale_up_stabilization_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description="Scale up to the lowest recommendation of this window (a burst shorter than it adds none).",
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="Scale down to the highest recommendation of this window, one replica at a time, drained.",
    )
    scale_to_zero: Literal[False] = Field(False, description="Reserved: scaling to zero replicas is not supported.")
    stale_capacity_ratio: float = Field(
        1.5,
        gt=1,
        le=100,
        description="The measured capacity is stale once the mean prompt or output length the proxies see "
        "differs from the probe's by more than this factor (either way); then the planner's prediction for "
        "the live workload, scaled by the last measured/predicted ratio, is used.",
    )


# ---- the spec ---------------------------------------------------------------------------------------


def _rank_ranges(role: DisaggregatedRoleSpec) -> list[tuple[int, int]]:
    """The handshake and notify port ranges the connector's ranks bind, inclusive, of every engine."""
    span = role.rank_port_span
    return [(base, base + span - 1) for _, p in role.engine_instances() for base in (p.handshake, p.notify)]


def _ports_of(role: DisaggregatedRoleSpec) -> list[tuple[int, int]]:
    return [(p.http, p.http) for _, p in role.engine_instances()] + _rank_ranges(role)


def _proxy_ports(proxy: ProxySpec) -> list[tuple[int, int]]:
    return [(port, port) for port in (proxy.port, proxy.admin_port, proxy.registration_port)]


def _cel_per_engine(role: str, single: str, each: str) -> str:
    """CEL: a list with ``each`` of every ``instances`` entry (bound to ``i``), or ``single`` without them."""
    return f"({cel_has_instances(f'self.{role}')} ? self.{role}.instances.map(i, {each}) : [{single}])"


def _cel_rank_ranges(role: str) -> str:
    span = f"(self.{role}.tensorParallelSize + self.{role}.dataParallelSize - 1)"
    ranges = [
        _cel_per_engine(role, f"[{base}, {base} + {span} - 1]", f"[{each}, {each} + {span} - 1]")
        for base, each in ((f"self.{role}.ports.{kind}", f"i.ports.{kind}") for kind in ("handshake", "notify"))
    ]
    return " + ".join(ranges)


def _cel_role_ports(role: str) -> str:
    http = _cel_per_engine(role, f"[self.{role}.ports.http, self.{role}.ports.http]", "[i.ports.http, i.ports.http]")
    return f"{http} + {_cel_rank_ranges(role)}"


_CEL_PROXY_PORTS = (
    "[self.proxy.port, self.proxy.port], [self.proxy.adminPort, self.proxy.adminPort], "
    "[self.proxy.registrationPort, self.proxy.registrationPort]"
)
_CEL_DISAGG_PORTS = f"({_cel_role_ports('prefill')} + {_cel_role_ports('decode')} + [{_CEL_PROXY_PORTS}])"
_CEL_COLOC_PORTS = f"(self.colocated.engines.map(e, [e.port, e.port]) + [{_CEL_PROXY_PORTS}])"


def _within_node(gpus: str, gpus_per_node: int) -> bool:
    bounds = parse_gpu_range(gpus)
    return bounds is None or bounds[1] < gpus_per_node


def _cel_within_node(expr: str) -> str:
    return f"!{cel_range_ok(expr)} || {cel_last(expr)} < self.node.gpusPerNode"


def _role_within_node_rule(role: str) -> Rule:
    has = cel_has_instances(f"self.{role}")
    every = f"self.{role}.instances.all(i, {_cel_within_node('i.gpus')})"
    return Rule(
        cel=f"self.mode != 'disaggregated' || ({has} ? {every} : {_cel_within_node(f'self.{role}.gpus')})",
        message=f"{role}.gpus must lie within 0 .. node.gpusPerNode - 1 "
        f"(with instances: every {role}.instances[*].gpus)",
        check=lambda s: (
            not s.disaggregated
            or all(_within_node(gpus, s.node.gpus_per_node) for gpus, _ in getattr(s, role).engine_instances())
        ),
        field_path=f".{role}.gpus",
    )


def _engine_gpu_ranges(s: PDDeploymentSpec) -> list[tuple[int, int] | None]:
    return [parse_gpu_range(gpus) for role in (s.prefill, s.decode) for gpus, _ in role.engine_instances()]


def _pd_disjoint(s: PDDeploymentSpec) -> bool:
    ranges = _engine_gpu_ranges(s)
    return any(r is None for r in ranges) or ranges_disjoint([r for r in ranges if r is not None])


def _cel_gpu_pairs(role: str) -> str:
    gpus = f"self.{role}.gpus"
    return _cel_per_engine(
        role, f"[{cel_first(gpus)}, {cel_last(gpus)}]", f"[{cel_first('i.gpus')}, {cel_last('i.gpus')}]"
    )


def _cel_gpus_ok(role: str) -> str:
    has = cel_has_instances(f"self.{role}")
    return f"({has} ? self.{role}.instances.all(i, {cel_range_ok('i.gpus')}) : {cel_range_ok(f'self.{role}.gpus')})"


_CEL_ENGINE_GPUS = f"({_cel_gpu_pairs('prefill')} + {_cel_gpu_pairs('decode')})"


def _colocated_gpus_ok(s: PDDeploymentSpec) -> bool:
    ranges = [parse_gpu_range(e.gpus) for e in s.colocated.engines]
    if any(r is None for r in ranges):
        return True
    bounded = [r for r in ranges if r is not None]
    return all(r[1] < s.node.gpus_per_node for r in bounded) and ranges_disjoint(bounded)


_CEL_COLOC_GPUS = (
    "self.colocated.engines.all(e, " + _cel_within_node("e.gpus") + ") && "
    "(size(self.colocated.engines) < 2 || !"
    + cel_range_ok("self.colocated.engines[0].gpus")
    + " || !"
    + cel_range_ok("self.colocated.engines[1].gpus")
    + " || "
    + cel_last("self.colocated.engines[0].gpus")
    + " < "
    + cel_first("self.colocated.engines[1].gpus")
    + " || "
    + cel_last("self.colocated.engines[1].gpus")
    + " < "
    + cel_first("self.colocated.engines[0].gpus")
    + ")"
)


def _one_parallel_dimension_rule(role: str) -> Rule:
    """DP > 1 together with TP > 1 makes two ranks of one engine bind the same side-channel port."""
    return Rule(
        cel=f"self.mode != 'disaggregated' || self.{role}.dataParallelSize == 1 || self.{role}.tensorParallelSize == 1",
        message=f"{role}.dataParallelSize > 1 needs {role}.tensorParallelSize 1: the MoRI-IO connector binds "
        "each rank's handshake and notify listener at base + dp_rank + tp_rank while the dialing side uses "
        "base + dp_rank * remote_tp + tp_rank, so dp0/tp1 and dp1/tp0 collide",
        check=lambda s: (
            not s.disaggregated or 1 in (getattr(s, role).data_parallel_size, getattr(s, role).tensor_parallel_size)
        ),
        field_path=f".{role}.dataParallelSize",
    )


def _outside_ephemeral(ranges: list[tuple[int, int]]) -> bool:
    low, high = EPHEMERAL_PORTS
    return all(last < low or first > high for first, last in ranges)


def _rank_ports_outside_ephemeral_rule(role: str) -> Rule:
    """Listeners that bind late must not sit where the kernel hands out random ports.

    The handshake and notify listeners bind only after the model has loaded (minutes), while vLLM's
    get_open_port() and, with hostNetwork, every process on the node keep drawing ports from the
    ephemeral range; a listener there fails to bind now and then. The HTTP port is not covered: vLLM
    binds it first thing at start-up (and the seed's decode uses 40005); docs/gpu-allocation.md.
    """
    low, high = EPHEMERAL_PORTS
    return Rule(
        cel=f"self.engine != 'vllm' || self.mode != 'disaggregated' || "
        f"({_cel_rank_ranges(role)}).all(r, r[1] < {low} || r[0] > {high})",
        message=f"{role}.ports.handshake and {role}.ports.notify (and those of every {role}.instances[*]; "
        "each base .. base + tensorParallelSize + dataParallelSize - 2) must lie outside the ephemeral port "
        f"range {low}-{high}: they bind after the model has loaded, when vLLM's get_open_port() (and, with "
        "hostNetwork, any process on the node) may already hold a random port there",
        check=lambda s: s.engine != "vllm" or not s.disaggregated or _outside_ephemeral(_rank_ranges(getattr(s, role))),
        field_path=f".{role}.ports",
    )


def _divides_heads(spec: PDDeploymentSpec) -> bool:
    heads = KNOWN_ATTENTION_HEADS.get(spec.model)
    return heads is None or all(heads % tp == 0 for tp in spec.tensor_parallel_sizes())


def _divides_attention_heads_rule() -> Rule:
    """vLLM refuses a tensor-parallel size that does not divide the model's attention heads.

    ``ModelConfig.verify_with_parallel_config`` raises "Total number of attention heads (H) must be
    divisible by tensor parallel size (T)"; checked here for the models whose config.json we know.
    """
    known = "{" + ", ".join(f"'{name}': {heads}" for name, heads in KNOWN_ATTENTION_HEADS.items()) + "}"
    sizes = (
        "(self.mode == 'disaggregated' ? [self.prefill.tensorParallelSize, self.decode.tensorParallelSize] : "
        "self.colocated.engines.map(e, e.tensorParallelSize))"
    )
    return Rule(
        cel=f"!(self.model in {known}) || {sizes}.all(t, {known}[self.model] % t == 0)",
        message="tensorParallelSize must divide the model's attention heads (vLLM refuses the rest): "
        + ", ".join(f"{name} has {heads}" for name, heads in KNOWN_ATTENTION_HEADS.items()),
        check=_divides_heads,
        field_path=".model",
    )


_CEL_RESOURCES = ("self.prefill.resources", "self.decode.resources", "self.proxy.resources")


def _cel_no_compute_limits(res: str) -> str:
    return f"(!has({res}.limits) || (!('cpu' in {res}.limits) && !('memory' in {res}.limits)))"


def _all_resources(s: PDDeploymentSpec) -> list[Resources]:
    return [s.prefill.resources, s.decode.resources, s.proxy.resources, *(e.resources for e in s.colocated.engines)]


class PDDeploymentSpec(ApiModel):
    """Desired state: per replica one pod on one GPU node running prefill, decode and proxy (or colocated engines)."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        description="Model to serve: a Hugging Face id (Qwen/Qwen3-235B-A22B-FP8) or a path under the model mount."
    )
    served_model_name: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        None, description="Name clients use in requests (vLLM --served-model-name); unset = model."
    )
    engine: Literal["vllm", "simulated"] = Field(
        "vllm",
        description=(
            "vllm: real engines on GPUs. simulated: the CPU simulated engine with the same pod shape, only the "
            "executable after `--` changes (for laptops and end-to-end tests)."
        ),
    )
    mode: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description=(
            "disaggregated: prefill and decode engines joined by the KV connector (containers prefill, decode, "
            "proxy). colocated: the seed's standard-serving baseline (containers engine-0 [, engine-1], proxy)."
        ),
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] = Field(
        DEFAULT_IMAGE, description="Runtime image (vLLM with MoRI-IO plus pdctl) used by every container."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the runtime image."
    )
    model_storage: ModelStorageSpec = Field(
        default_factory=ModelStorageSpec, description="Model weights volume, hub token and load-time budget."
    )
    cache_storage: CacheStorageSpec = Field(
        default_factory=CacheStorageSpec,
        description="The engines' compile and JIT caches (vLLM, Triton, AITER, MoRI) on a volume of their own.",
    )
    prefill: PrefillSpec = Field(default_factory=PrefillSpec, description="The prefill engine (disaggregated mode).")
    decode: DecodeSpec = Field(default_factory=DecodeSpec, description="The decode engine (disaggregated mode).")
    colocated: ColocatedSpec = Field(default_factory=ColocatedSpec, description="The engines of colocated mode.")
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, description="KV-cache transfer between prefill and decode."
    )
    gpu_allocation: GpuAllocationSpec = Field(default_factory=GpuAllocationSpec, description="How containers get GPUs.")
    node: NodeSpec = Field(default_factory=NodeSpec, description="Node size and placement.")
    replicas: int = Field(
        1,
        ge=1,
        le=MAX_REPLICAS,
        description=(
            "Serving pods, each the whole node layout (prefill, decode and proxy) on its own node; the Service "
            "spreads clients across the ready ones. The scale subresource sets it: `kubectl scale pdd/NAME "
            "--replicas 3`, or a HorizontalPodAutoscaler. Pod names: NAME for the first, NAME-1, NAME-2, ..."
        ),
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Rolling updates and disruption budget across replicas."
    )
    proxy: ProxySpec = Field(default_factory=ProxySpec, description="The proxy and its Service.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="A request router in front of the replicas.")
    simulation: SimulationSpec = Field(
        default_factory=SimulationSpec, description="Settings of engine simulated (ignored for vllm)."
    )
    goodput_probe: GoodputProbeSpec = Field(
        default_factory=GoodputProbeSpec, description="Goodput probes written to status.goodput."
    )
    autotune: AutotuneSpec = Field(
        default_factory=AutotuneSpec, description="Live autotuning of the layout with the goodput probe."
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Replicas from demand against measured goodput capacity."
    )
    termination_grace_period_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="Time for in-flight requests and KV transfers to drain on deletion: the proxy's drain delay "
        "and drain timeout, which the engines' preStop hook waits out before their SIGTERM, fit inside it.",
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Who else the serving pod's NetworkPolicy admits."
    )
    inference_pool: InferencePoolSpec = Field(
        default_factory=InferencePoolSpec, description="An InferencePool for a Gateway API inference gateway."
    )
    pod_template: PodTemplateSpec = Field(
        default_factory=PodTemplateSpec,
        description="Labels, annotations, image pull secrets, ServiceAccount, RuntimeClass and extra volumes of "
        "the serving pod: what the API does not model elsewhere (fields it does model are refused here).",
    )
    qos_class: Literal["Burstable", "Guaranteed"] = Field(
        "Burstable",
        description=(
            "QoS class of the serving pod. Burstable: CPU and memory requests (defaults or resources.requests), "
            "no CPU or memory limit on engines. Guaranteed: every container's CPU and memory limits equal its "
            "requests (last to be evicted; CPU-manager pinning with integer CPUs); then resources.limits must "
            "not set cpu or memory."
        ),
    )

    def proxy_kv_wait_limit(self) -> float:
        """Past defer + transfer timeout (engine time) decode can no longer get its KV: prefill dropped it."""
        kv = self.kv_transfer
        engine_seconds = kv.defer_timeout_seconds + kv.transfer_timeout_seconds
        scale = self.simulation.time_scale if self.engine == "simulated" else 1.0
        return engine_seconds / scale + protocol.KV_WAIT_MARGIN_S

    def proxy_kv_wait_seconds(self) -> float:
        """The proxy's wait for decode's first byte after prefill answered (--kv-wait-timeout)."""
        chosen = self.proxy.timeouts.kv_wait_seconds
        return self.proxy_kv_wait_limit() if chosen is None else chosen

    _rules = (
        _role_within_node_rule("prefill"),
        _role_within_node_rule("decode"),
        Rule(
            cel=f"self.mode != 'disaggregated' || !{_cel_gpus_ok('prefill')} || !{_cel_gpus_ok('decode')} || "
            f"{cel_ranges_disjoint(_CEL_ENGINE_GPUS)}",
            message="prefill.gpus and decode.gpus must not overlap (with instances: no two engines of prefill "
            "and decode may share a GPU)",
            check=lambda s: not s.disaggregated or _pd_disjoint(s),
            field_path=".decode.gpus",
        ),
        _divides_attention_heads_rule(),
        Rule(
            cel=f"self.mode != 'colocated' || ({_CEL_COLOC_GPUS})",
            message="colocated.engines[*].gpus must lie within 0 .. node.gpusPerNode - 1 and must not overlap",
            check=lambda s: s.disaggregated or _colocated_gpus_ok(s),
            field_path=".colocated.engines",
        ),
        Rule(
            cel=f"self.mode != 'disaggregated' || {cel_ranges_disjoint(_CEL_DISAGG_PORTS)}",
            message="ports must be distinct: prefill.ports, decode.ports and every instances[*].ports (handshake "
            "and notify reserve tensorParallelSize + dataParallelSize - 1 ports from their base) and proxy port, "
            "adminPort, "
            "registrationPort",
            check=lambda s: (
                not s.disaggregated
                or ranges_disjoint(_ports_of(s.prefill) + _ports_of(s.decode) + _proxy_ports(s.proxy))
            ),
        ),
        Rule(
            cel=f"self.mode != 'colocated' || {cel_ranges_disjoint(_CEL_COLOC_PORTS)}",
            message="ports must be distinct: colocated.engines[*].port and proxy port, adminPort, registrationPort",
            check=lambda s: (
                s.disaggregated
                or ranges_disjoint([(e.port, e.port) for e in s.colocated.engines] + _proxy_ports(s.proxy))
            ),
        ),
        Rule(
            cel="self.engine != 'vllm' || self.mode != 'disaggregated' || self.kvTransfer.backend != 'rdma' || "
            "self.gpuAllocation.strategy == 'hostDevices' || has(self.kvTransfer.rdma.resourceName)",
            message="kvTransfer.backend rdma needs an RDMA device in the engine containers: set "
            "kvTransfer.rdma.resourceName, e.g. rdma/hca_shared_devices_a or amd.com/nic; hostNetwork brings "
            "no /dev/infiniband",
            check=lambda s: not s.needs_rdma_resource or s.kv_transfer.rdma.resource_name is not None,
            field_path=".kvTransfer.rdma.resourceName",
        ),
        _one_parallel_dimension_rule("prefill"),
        _one_parallel_dimension_rule("decode"),
        _rank_ports_outside_ephemeral_rule("prefill"),
        _rank_ports_outside_ephemeral_rule("decode"),
        Rule(
            cel="self.mode != 'disaggregated' || self.kvTransfer.transferMode != 'read' || "
            f"!has(self.decode.extraArgs) || !{cel_sets_compilation_config('self.decode.extraArgs')} || "
            "self.decode.extraArgs.exists(a, a.contains('cudagraph_mode'))",
            message="decode.extraArgs set a compilation config without cudagraph_mode: in read mode it replaces "
            "the operator's cudagraph_mode PIECEWISE (MoRI-IO's per-layer KV-read wait cannot run inside full "
            "CUDA graphs), so set cudagraph_mode in it explicitly",
            check=lambda s: (
                not s.disaggregated
                or s.kv_transfer.transfer_mode != "read"
                or not sets_compilation_config(s.decode.extra_args)
                or any("cudagraph_mode" in a for a in s.decode.extra_args)
            ),
            field_path=".decode.extraArgs",
        ),
        Rule(
            cel="self.mode != 'disaggregated' || !has(self.proxy.timeouts.kvWaitSeconds) || "
            "self.proxy.timeouts.kvWaitSeconds <= (self.kvTransfer.deferTimeoutSeconds + "
            "self.kvTransfer.transferTimeoutSeconds) / (self.engine == 'simulated' ? self.simulation.timeScale : 1.0) "
            f"+ {protocol.KV_WAIT_MARGIN_S}",
            message="proxy.timeouts.kvWaitSeconds must be <= kvTransfer.deferTimeoutSeconds + "
            f"kvTransfer.transferTimeoutSeconds (divided by simulation.timeScale for engine simulated) + "
            f"{protocol.KV_WAIT_MARGIN_S:g} s: past that, prefill has dropped the KV transfer and the proxy would "
            "wait for KV that never comes",
            check=lambda s: (
                not s.disaggregated
                or s.proxy.timeouts.kv_wait_seconds is None
                or s.proxy.timeouts.kv_wait_seconds <= s.proxy_kv_wait_limit()
            ),
            field_path=".proxy.timeouts.kvWaitSeconds",
        ),
        Rule(
            cel="self.mode != 'disaggregated' || self.kvTransfer.backend != 'xgmi' || "
            "self.gpuAllocation.strategy == 'hostDevices'",
            message="kvTransfer.backend xgmi needs gpuAllocation.strategy hostDevices: with devicePlugin or dra "
            "each container sees only its own GPUs, so MoRI-IO cannot reach the peer over XGMI",
            check=lambda s: (
                not s.disaggregated or s.kv_transfer.backend != "xgmi" or s.gpu_allocation.strategy == "hostDevices"
            ),
            field_path=".kvTransfer.backend",
        ),
        Rule(
            cel="self.qosClass != 'Guaranteed' || ("
            + " && ".join(_cel_no_compute_limits(r) for r in _CEL_RESOURCES)
            + " && self.colocated.engines.all(e, "
            + _cel_no_compute_limits("e.resources")
            + "))",
            message="qosClass Guaranteed sets the CPU and memory limits to the requests: resources.limits of "
            "prefill, decode, colocated.engines and proxy must not set cpu or memory (set requests instead)",
            check=lambda s: (
                s.qos_class != "Guaranteed"
                or not any(k in r.limits for r in _all_resources(s) for k in ("cpu", "memory"))
            ),
            field_path=".qosClass",
        ),
        Rule(
            cel="self.gpuAllocation.strategy != 'dra' || !(self.engine == 'vllm' || (has(self.simulation) && "
            "has(self.simulation.reserveGpus) && self.simulation.reserveGpus)) || "
            "(has(self.gpuAllocation.dra.pciAddresses) && size(self.gpuAllocation.dra.pciAddresses) > 0)",
            message="gpuAllocation.strategy dra needs gpuAllocation.dra.pciAddresses (the PCI address of each GPU "
            "of the node, from its ResourceSlices): the AMD DRA driver publishes no attribute that means GPU index",
            check=lambda s: not s.uses_dra or bool(s.gpu_allocation.dra.pci_addresses),
            field_path=".gpuAllocation.dra.pciAddresses",
        ),
        Rule(
            cel="!has(self.gpuAllocation.dra.pciAddresses) || size(self.gpuAllocation.dra.pciAddresses) == 0 || "
            "size(self.gpuAllocation.dra.pciAddresses) == self.node.gpusPerNode",
            message="gpuAllocation.dra.pciAddresses must list one address per GPU (node.gpusPerNode) or none",
            check=lambda s: len(s.gpu_allocation.dra.pci_addresses) in (0, s.node.gpus_per_node),
            field_path=".gpuAllocation.dra.pciAddresses",
        ),
        Rule(
            cel="!self.goodputProbe.enabled || self.mode != 'disaggregated' || !has(self.decode.maxModelLen) || "
            "self.goodputProbe.promptTokens + self.goodputProbe.outputTokens <= self.decode.maxModelLen",
            message="goodputProbe.promptTokens + goodputProbe.outputTokens must fit in decode.maxModelLen",
            check=lambda s: (
                not (s.goodput_probe.enabled and s.disaggregated and s.decode.max_model_len)
                or s.goodput_probe.prompt_tokens + s.goodput_probe.output_tokens <= (s.decode.max_model_len or 0)
            ),
            field_path=".goodputProbe",
        ),
        Rule(
            cel="!self.autotune.enabled || self.replicas == 1",
            message="autotune.enabled needs replicas 1 (trials roll the one serving pod)",
            check=lambda s: not s.autotune.enabled or s.replicas == 1,
            field_path=".autotune.enabled",
        ),
        Rule(
            cel="!self.autotune.enabled || !self.autoscaling.enabled",
            message="autotune.enabled and autoscaling.enabled exclude each other (trials roll the one serving pod)",
            check=lambda s: not (s.autotune.enabled and s.autoscaling.enabled),
            field_path=".autoscaling.enabled",
        ),
        Rule(
            cel="!self.autotune.enabled || self.goodputProbe.enabled",
            message="autotune.enabled needs goodputProbe.enabled (each trial is measured by a goodput probe)",
            check=lambda s: not s.autotune.enabled or s.goodput_probe.enabled,
            field_path=".autotune.enabled",
        ),
    )

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    def tensor_parallel_sizes(self) -> list[int]:
        """The tensor-parallel size of every engine role of the mode."""
        if self.disaggregated:
            return [self.prefill.tensor_parallel_size, self.decode.tensor_parallel_size]
        return [e.tensor_parallel_size for e in self.colocated.engines]

    # ---- yes/no facts about the spec, in one place --------------------------------------------------------

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disaggregated"

    @property
    def transfer_in_effect(self) -> Literal["write", "read", "none"]:
        """The KV transfer mode the pod runs with (none when colocated: no KV moves)."""
        return self.kv_transfer.transfer_mode if self.disaggregated else "none"

    @property
    def reserves_gpus(self) -> bool:
        """Real engines, or simulated ones asked to request GPUs as vllm would."""
        return self.engine == "vllm" or self.simulation.reserve_gpus

    @property
    def uses_dra(self) -> bool:
        return self.reserves_gpus and self.gpu_allocation.strategy == "dra"

    @property
    def pins_gpu_devices(self) -> bool:
        """Whether the GPU indices of the spec are the physical ones (hostDevices, dra)."""
        return self.reserves_gpus and self.gpu_allocation.strategy in ("hostDevices", "dra")

    @property
    def needs_rdma_resource(self) -> bool:
        """Real engines on backend rdma need /dev/infiniband: only an RDMA device plugin mounts it.

        hostDevices is the exception: its privileged containers see every device node of the host.
        """
        return (
            self.engine == "vllm"
            and self.disaggregated
            and self.kv_transfer.backend == "rdma"
            and self.gpu_allocation.strategy != "hostDevices"
        )

    @property
    def uses_nic_resource(self) -> bool:
        """Engines request the NIC as an extended resource (kvTransfer.rdma.resourceName)."""
        kv = self.kv_transfer
        return self.reserves_gpus and self.disaggregated and kv.backend == "rdma" and kv.rdma.resource_name is not None

    @property
    def host_network(self) -> bool:
        return self.engine == "vllm" and self.disaggregated and self.kv_transfer.rdma.host_network

    def effective_node_selector(self) -> dict[str, str]:
        if self.node.node_selector is not None:
            return dict(self.node.node_selector)
        return dict(MI300X_NODE_SELECTOR) if self.engine == "vllm" else {}


# ---- status -------------------------------------------------------------------------------------------


Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"]
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="SpecValid, PrefillReady, DecodeReady, EngineReady, ProxyReady, Ready, KVTransferVerified, "
        "GoodputMet, ChildrenAdmitted, NodeLost, Tuned, RouterReady."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(max_length=128)] = Field("", description="CamelCase reason.")
    message: Annotated[str, StringConstraints(max_length=4096)] = Field("", description="Human-readable detail.")
    last_transition_time: Timestamp | None = Field(None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation this was computed for.")


class RoleGpus(ApiModel):
    """The GPUs one engine container got."""

    count: int = Field(0, ge=0, le=64, description="Number of GPUs.")
    devices: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description='Exact physical indices ("0-3") when pinned (hostDevices, dra); unset for devicePlugin.'
    )


class RoleStatus(ApiModel):
    """One container of the serving pod."""

    name: Annotated[str, StringConstraints(max_length=63)] = Field(description="Container name.")
    role: Literal["prefill", "decode", "engine", "proxy"] = Field(description="What the container does.")
    ready: bool = Field(False, description="The container passes its readiness probe.")
    started: bool = Field(False, description="The container passed its startup probe.")
    restart_count: int = Field(0, ge=0, description="Container restarts.")
    state: Literal["waiting", "running", "terminated", "unknown"] = Field("unknown", description="Container state.")
    reason: Annotated[str, StringConstraints(max_length=128)] = Field("", description="Reason of the state.")
    message: Annotated[str, StringConstraints(max_length=4096)] = Field(
        "", description="Last termination message (e.g. a failed preflight) or waiting message."
    )
    gpus: RoleGpus | None = Field(None, description="GPUs of this container (engines only).")


class AllocatedDevice(ApiModel):
    """One device a ResourceClaim was allocated (its status.allocation.devices.results entry)."""

    request: Annotated[str, StringConstraints(max_length=63)] = Field(description="The claim's request (an engine).")
    driver: Annotated[str, StringConstraints(max_length=63)] = Field(description="DRA driver.")
    pool: Annotated[str, StringConstraints(max_length=253)] = Field(description="Pool (the node, for the AMD driver).")
    device: Annotated[str, StringConstraints(max_length=63)] = Field(description="Device name in the pool.")


class GpuAssignment(ApiModel):
    """Which GPUs the engines use, and how certain that is."""

    strategy: Literal["devicePlugin", "hostDevices", "dra", "none"] = Field(
        description="gpuAllocation.strategy (none for simulated engines that reserve no GPUs)."
    )
    prefill: Annotated[str, StringConstraints(max_length=256)] = Field(
        "-",
        description='Prefill GPUs ("0-3" pinned, "4 (plugin-chosen)" with the device plugin, "-" if none); '
        'several engines are listed together ("0-1, 2-3", "2+2 (plugin-chosen)").',
    )
    decode: Annotated[str, StringConstraints(max_length=256)] = Field("-", description="Decode GPUs, same format.")
    engines: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=list, max_length=2, description="GPUs of engine-0 [, engine-1] in colocated mode."
    )
    note: Annotated[str, StringConstraints(max_length=1024)] = Field("", description="How exact the assignment is.")
    claim: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None, description="dra: the serving pod's ResourceClaim, whose allocation is reported in allocated."
    )
    allocated: list[AllocatedDevice] = Field(
        default_factory=list,
        max_length=64,
        description="dra: the devices the ResourceClaim was allocated, read back from its status.allocation.",
    )


class LatencyStats(ApiModel):
    """Percentiles of one latency, in milliseconds."""

    p50: float | None = Field(None, description="Median (unset when no request succeeded).")
    p90: float | None = Field(None, description="90th percentile.")
    p99: float | None = Field(None, description="99th percentile.")
    mean: float | None = Field(None, description="Mean.")


class ProbeSlo(ApiModel):
    """The SLO a probe measured against."""

    ttft_ms: float = Field(description="TTFT bound, ms.")
    itl_ms: float = Field(description="ITL bound, ms.")
    target: float = Field(description="Attainment target.")


class ProbeMeasured(ApiModel):
    """What configuration the probe measured, so results stay comparable after spec changes."""

    mode: Annotated[str, StringConstraints(max_length=32)] = Field(description="disaggregated or colocated.")
    transfer_mode: Annotated[str, StringConstraints(max_length=32)] = Field(
        description="write, read, or none (colocated)."
    )
    engine: Annotated[str, StringConstraints(max_length=32)] = Field(description="vllm or simulated.")
    gpu_split: Annotated[str, StringConstraints(max_length=128)] = Field(
        description='GPU split, e.g. "prefill 0-3 TP4, decode 4-7 TP4".'
    )
    generation: int = Field(ge=0, description="metadata.generation the probe ran against.")


class GoodputStatus(ApiModel):
    """The latest goodput probe result (summary written by `pdctl bench --result-file`)."""

    time: Timestamp = Field(description="When the probe finished (RFC 3339).")
    rate: float = Field(description="Offered request rate, requests per second.")
    requests: int = Field(ge=0, description="Requests sent.")
    good: int = Field(ge=0, description="Requests meeting both TTFT and ITL bounds.")
    errors: int = Field(ge=0, description="Failed requests (counted as not good).")
    attainment: float = Field(ge=0, le=1, description="good / requests.")
    attainment_low: float | None = Field(None, description="Wilson 95% interval, lower bound.")
    attainment_high: float | None = Field(None, description="Wilson 95% interval, upper bound.")
    ttft_ms: LatencyStats = Field(description="Time to first token.")
    itl_ms: LatencyStats = Field(description="Per-request mean inter-token latency.")
    goodput_rate: float | None = Field(None, description="Highest rate meeting the target (probe search only).")
    slo: ProbeSlo = Field(description="SLO of the probe.")
    met: bool = Field(description="attainment >= slo.target.")
    measured: ProbeMeasured = Field(description="What was measured.")
    summary: Annotated[str, StringConstraints(max_length=64)] = Field(
        description='Short form for `kubectl get pdd`, e.g. "92% @8/s".'
    )


class ProbeState(ApiModel):
    """Bookkeeping of probe Jobs (so that probes never overlap)."""

    job_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(None, description="Running probe Job.")
    trigger: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        None, description="Why it runs: ready, interval, annotation or autotune."
    )
    started_at: Timestamp | None = Field(None, description="When the running Job was created.")
    last_finished_at: Timestamp | None = Field(None, description="When the last probe finished.")
    last_annotation: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        None, description=f"Value of the {RUN_PROBE_ANNOTATION} annotation last honoured."
    )
    last_error: Annotated[str, StringConstraints(max_length=4096)] | None = Field(
        None, description="Why the last probe produced no result."
    )


LayoutName = Annotated[str, StringConstraints(max_length=64)]


class AutotuneTrial(ApiModel):
    """One layout tried by autotuning: what the planner predicted and what the goodput probe measured."""

    layout: LayoutName = Field(description='Layout, in `pdctl plan` names: "2xTP4", "1P TP4 + 1D TP4".')
    kind: Literal["colocated", "disaggregated"] = Field(description="Colocated or disaggregated.")
    gpus: int = Field(ge=0, le=64, description="GPUs the layout uses.")
    predicted_attainment: float = Field(ge=0, le=1, description="The planner's attainment at the probe's rate.")
    attainment: float | None = Field(None, ge=0, le=1, description="Measured attainment (None: not measured yet).")
    goodput: float | None = Field(
        None, ge=0, description="Measured good requests per second: attainment x the probe's rate."
    )
    met: bool | None = Field(None, description="Whether the measured attainment met the target.")
    time: Timestamp | None = Field(None, description="When the probe finished.")
    error: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        None, description="Why the trial has no measurement (the probe failed); it counts as attainment 0."
    )


class AutotuneStatus(ApiModel):
    """Autotuning's progress: the trials in order, the layout in force and the tuned result."""

    workload: Annotated[str, StringConstraints(max_length=256)] = Field(
        "", description="The workload the trials are for; a change of it (goodputProbe, maxTrials) starts over."
    )
    trials: list[AutotuneTrial] = Field(
        default_factory=list, max_length=8, description="Every trial, planned and measured, in the order run."
    )
    layout_in_force: LayoutName | None = Field(
        None, description="The layout the serving pod runs: the current trial's, then the tuned one."
    )
    probing: LayoutName | None = Field(None, description="The layout the running probe Job measures for a trial.")
    tuned: LayoutName | None = Field(None, description="The best measured layout, once every trial ran.")
    message: Annotated[str, StringConstraints(max_length=1024)] = Field("", description="What autotuning does now.")


class ReplicaStatus(ApiModel):
    """One serving pod (replica): where it runs, its phase, and whether it takes traffic."""

    index: int = Field(ge=0, le=MAX_REPLICAS, description="Replica index (pod NAME for 0, NAME-<index> after).")
    pod_name: Annotated[str, StringConstraints(max_length=253)] = Field(description="The replica's pod.")
    pod_uid: Annotated[str, StringConstraints(max_length=64)] | None = Field(None, description="Its UID.")
    pod_ip: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, alias="podIP", description="Its IP (its proxy's admin /status is read there)."
    )
    node_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(None, description="Its node.")
    phase: Phase = Field(description="The replica's own phase (same meanings as status.phase).")
    message: Annotated[str, StringConstraints(max_length=4096)] = Field("", description="Why.")
    ready: Annotated[str, StringConstraints(max_length=16)] = Field(
        "", description='Ready containers of this pod, e.g. "3/3".'
    )
    current: bool = Field(False, description="The pod runs the current spec (its spec hash matches).")
    available: bool = Field(
        False, description="Ready and, when disaggregated, KVTransferVerified: counts as serving for rollouts."
    )
    kv_transfer: Condition | None = Field(None, description="This pod's KVTransferVerified condition.")


class RouterStatus(ApiModel):
    """The router's pods (spec.router), as the Deployment NAME-router's controller counts them."""

    replicas: int = Field(0, ge=0, description="Router pods wanted (spec.router.replicas).")
    ready_replicas: int = Field(0, ge=0, description="Router pods passing their readiness probe.")
    ready: Annotated[str, StringConstraints(max_length=16)] = Field(
        "", description='Ready router pods / router pods, e.g. "2/2" (column ROUTER, -o wide).'
    )


class CapacityStatus(ApiModel):
    """How many requests per second one replica holds within the probe's SLO, and where that comes from."""

    requests_per_second: float = Field(ge=0, description="Per replica, at the workload below.")
    source: Literal["measured", "predicted", "scaled"] = Field(
        description="measured: the last goodput search; predicted: the planner for this layout; scaled: the "
        "planner's prediction for the live workload times the last measured/predicted ratio."
    )
    prompt_tokens: float = Field(ge=0, description="Mean prompt length the capacity is for.")
    output_tokens: float = Field(ge=0, description="Mean output length the capacity is for.")
    time: Timestamp | None = Field(None, description="When it was measured (measured) or derived.")
    stale: bool = Field(False, description="The live workload moved away from the measured one (see source).")
    measured_over_predicted: float | None = Field(
        None, ge=0, description="scaled: the last measured capacity over the planner's, at the probe's lengths."
    )
    message: Annotated[str, StringConstraints(max_length=256)] = Field(
        "", description="Where the figure comes from, e.g. why it is stale and how it was scaled."
    )
    summary: Annotated[str, StringConstraints(max_length=64)] = Field(
        "", description='Short form for `kubectl get pdd -o wide`, e.g. "8.9/s measured".'
    )


class DemandStatus(ApiModel):
    """What the replicas' proxies see, summed over the replicas that reported, over their window."""

    requests_per_second: float = Field(ge=0, description="Requests arriving per second.")
    in_flight: int = Field(ge=0, description="Requests being served now.")
    queued: int = Field(
        ge=0, description="Requests waiting now: in the admission queue (proxy.admission) or for a decode slot."
    )
    mean_prompt_tokens: float | None = Field(None, ge=0, description="Mean prompt length of the window's requests.")
    mean_output_tokens: float | None = Field(None, ge=0, description="Mean output length of the window's requests.")
    window_seconds: float = Field(ge=0, description="The window the rate and means cover.")
    replicas_reporting: int = Field(ge=0, description="Replica proxies whose report is summed.")
    time: Timestamp = Field(description="When it was read.")
    summary: Annotated[str, StringConstraints(max_length=64)] = Field(
        "", description='Short form for `kubectl get pdd -o wide`, e.g. "21.3/s".'
    )


class ScaleRecommendation(ApiModel):
    """One reconcile's raw recommendation, kept for the stabilization windows."""

    time: Timestamp = Field(description="When it was made.")
    replicas: int = Field(ge=0, le=MAX_REPLICAS, description="Replicas demand asked for then.")


class AutoscalingStatus(ApiModel):
    """spec.autoscaling's state: the recommendations in its windows and its last decision."""

    desired_replicas: int = Field(ge=0, le=MAX_REPLICAS, description="Replicas the last decision asked for.")
    recommendations: list[ScaleRecommendation] = Field(
        default_factory=list, max_length=64, description="Recent recommendations, oldest first."
    )
    last_scale_time: Timestamp | None = Field(None, description="When spec.replicas was last changed.")
    message: Annotated[str, StringConstraints(max_length=1024)] = Field("", description="The last decision's reason.")


class PDDeploymentStatus(ApiModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(None, ge=0, description="Last metadata.generation reconciled.")
    phase: Phase | None = Field(
        None,
        description="Pending, Progressing, Ready, Degraded or Failed; Ready when every replica is Ready.",
    )
    message: Annotated[str, StringConstraints(max_length=4096)] = Field("", description="Why the phase is what it is.")
    ready: Annotated[str, StringConstraints(max_length=16)] = Field(
        "",
        description='Ready replicas / replicas, e.g. "2/3" (column READY); containers are in containersReady.',
    )
    containers_ready: Annotated[str, StringConstraints(max_length=16)] = Field(
        "",
        description='Ready containers / containers over every replica, e.g. "9/9" (column CONTAINERS, -o wide).',
    )
    replicas: int = Field(0, ge=0, description="Serving pods that exist, current or not (the scale subresource).")
    ready_replicas: int = Field(0, ge=0, description="Serving pods whose containers are all ready.")
    updated_replicas: int = Field(0, ge=0, description="Serving pods running the current spec.")
    available_replicas: int = Field(
        0, ge=0, description="Ready pods that also verified a KV transfer (when disaggregated)."
    )
    selector: Annotated[str, StringConstraints(max_length=512)] = Field(
        "", description="Label selector of the serving pods (the scale subresource's, for HorizontalPodAutoscalers)."
    )
    replica_statuses: list[ReplicaStatus] = Field(
        default_factory=list, max_length=MAX_REPLICAS, description="Per replica: pod, node, phase, readiness."
    )
    transfer: Annotated[str, StringConstraints(max_length=16)] = Field(
        "", description="KV transfer mode in effect: write, read, or none (colocated)."
    )
    pod_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None, description="Serving pod of the first replica (every replica: replicaStatuses)."
    )
    pod_uid: Annotated[str, StringConstraints(max_length=64)] | None = Field(None, description="Its UID.")
    pod_ip: Annotated[str, StringConstraints(max_length=64)] | None = Field(None, alias="podIP", description="Its IP.")
    node_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(None, description="Its node.")
    roles: list[RoleStatus] = Field(
        default_factory=list,
        max_length=2 * MAX_ROLE_INSTANCES + 1,
        description="Per-container readiness of the first replica's pod: every engine instance and the proxy.",
    )
    gpu_assignment: GpuAssignment | None = Field(None, description="GPUs per engine.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="SpecValid, role readiness, Ready, KVTransferVerified, GoodputMet, Tuned, ChildrenAdmitted (False "
        "while the API server refuses a child: the object, the policy and the fields at fault), NodeLost (once the "
        "pod's node was not Ready), RouterReady (with spec.router.enabled: True while at least one router pod is "
        "ready, False while none is, Unknown while the router Deployment does not exist yet or cannot be read), "
        "ScalingActive (with spec.autoscaling.enabled: True while the operator sets replicas from demand and "
        "capacity, False with the reason it cannot: no capacity, no demand report, another owner of replicas).",
    )
    goodput: GoodputStatus | None = Field(None, description="Latest goodput probe result.")
    probe: ProbeState = Field(default_factory=ProbeState, description="Probe Job bookkeeping.")
    autotune: AutotuneStatus | None = Field(None, description="Autotuning's trials and result (spec.autotune).")
    router: RouterStatus | None = Field(
        None, description="The router's pods, with spec.router.enabled only (their readiness: RouterReady)."
    )
    capacity: CapacityStatus | None = Field(None, description="Requests per second one replica holds within the SLO.")
    demand: DemandStatus | None = Field(None, description="Requests per second the replicas' proxies see.")
    autoscaling: AutoscalingStatus | None = Field(None, description="spec.autoscaling's recommendations and decision.")


class PDDeployment(ApiModel):
    """A prefill/decode disaggregated (or colocated) vLLM deployment on one GPU node."""

    api_version: Literal["pd.serving.dev/v1alpha1"] = Field(
        "pd.serving.dev/v1alpha1", description="pd.serving.dev/v1alpha1"
    )
    kind: Literal["PDDeployment"] = Field("PDDeployment", description="PDDeployment")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: PDDeploymentSpec = Field(description="Desired state.")
    status: PDDeploymentStatus | None = Field(None, description="Observed state.")
