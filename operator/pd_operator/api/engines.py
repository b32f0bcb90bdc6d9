"""The engines: settings every engine shares, the prefill and decode roles (one engine or several), the
colocated engines, the KV transfer between them and the simulated engine's settings.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from pd_operator.api.shared import MAX_ROLE_INSTANCES, ApiModel, Arg, Checked, EnvVar, Port, Quantity, Resources
from pd_operator.rules import (
    GPU_RANGE_MAX_LENGTH,
    Rule,
    ValueRule,
    cel_count,
    cel_list,
    cel_range_ok,
    gpu_count,
    parse_gpu_range,
)
from pd_operator.vllm_flags import MANAGED_FLAGS, cel_flag_key, cel_names_flag, flag_key, names_flag
from pd_runtime import protocol

GpuRange = Annotated[str, StringConstraints(min_length=1, max_length=GPU_RANGE_MAX_LENGTH)]


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
    # The engines' and the proxy's admin key, from the operator's credentials Secret (docs/security.md).
    "VLLM_API_KEY",
    "PD_PROXY_ADMIN_KEY",
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
# One word of extraArgs; the rule names the word's item (spec.prefill.extraArgs[3]) and the flag vLLM reads in it.
_NOT_MANAGED = ValueRule(
    cel=f"!{cel_names_flag('self', MANAGED_FLAGS)}",
    check=lambda word: not names_flag(word, MANAGED_FLAGS),
    subject_cel=cel_flag_key("self"),
    subject=flag_key,
    message="is managed by the operator: vLLM reads it as a flag the operator renders or counts on "
    "(docs/security.md lists them)",
    summary="extraArgs must not set a flag the operator renders or counts on, in any spelling vLLM reads as it "
    "(underscores, a prefix, --flag.key=value; docs/security.md lists them)",
)
EngineArg = Annotated[Arg, Checked(_NOT_MANAGED)]
_ENV_RULES = (
    Rule(
        cel=f"!has(self.env) || self.env.all(e, !(e.name in {cel_list(MANAGED_ENV)}))",
        message="env must not set variables the operator manages (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, "
        "ROCR_VISIBLE_DEVICES, POD_IP, VLLM_HOST_IP, VLLM_MORIIO_CONNECTOR_READ_MODE, "
        "VLLM_ENGINE_READY_TIMEOUT_S, VLLM_API_KEY, PD_PROXY_ADMIN_KEY)",
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
    extra_args: list[EngineArg] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "More `vllm serve` arguments, appended verbatim. Flags the operator renders itself (--port, -tp, "
            "--kv-transfer-config, ...) or counts on (--host, --uds, --headless, --api-server-count, "
            "--data-parallel-size-local, -pp, --config, ...: docs/security.md lists them) are refused in every "
            "spelling vLLM reads as them (--tensor_parallel-size, --tensor-par, --kv-transfer-config.kv_role=..., -n2)."
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

    _rules: ClassVar[tuple[Rule, ...]] = (_GPUS_WELL_FORMED, _GPUS_MATCH_PARALLELISM, *_ENV_RULES)

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
        *_ENV_RULES,
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
    load_failure_policy: Literal["fail", "recompute"] | None = Field(
        None,
        description=(
            "kv_load_failure_policy: what a decode engine does with a request whose KV cannot load (a failed "
            "read; from vLLM 0.33 in write mode also a transfer prefill gave up on after deferTimeoutSeconds, "
            "write_failed): fail it at once (the proxy answers 502 kv_load_failed) or recompute its prompt on "
            "decode (the client is served, decode pays the prefill). Unset: vLLM's default, fail. Rendered "
            "into --kv-transfer-config for the releases whose KVTransferConfig has the key (0.31 - 0.34 all do)."
        ),
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
