"""The spec: PDDeploymentSpec, its parts put together, with the cross-field rules that span them and the
yes/no facts the rest of the operator asks of a spec.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from pd_operator.api.engines import (
    ColocatedSpec,
    DecodeSpec,
    DisaggregatedRoleSpec,
    KVTransferSpec,
    PrefillSpec,
    SimulationSpec,
    cel_has_instances,
)
from pd_operator.api.placement import (
    MI300X_NODE_SELECTOR,
    CacheStorageSpec,
    GpuAllocationSpec,
    ModelStorageSpec,
    NodeSpec,
    PodTemplateSpec,
)
from pd_operator.api.serving import (
    AutoscalingSpec,
    AutotuneSpec,
    GoodputProbeSpec,
    InferencePoolSpec,
    NetworkPolicySpec,
    ProxySpec,
    RolloutSpec,
    RouterSpec,
)
from pd_operator.api.shared import DEFAULT_IMAGE, MAX_REPLICAS, ApiModel, Resources
from pd_operator.rules import (
    Rule,
    cel_first,
    cel_last,
    cel_range_ok,
    cel_ranges_disjoint,
    parse_gpu_range,
    ranges_disjoint,
)
from pd_operator.vllm_flags import cel_sets_compilation_config, sets_compilation_config
from pd_runtime import protocol
from pd_runtime.sim.versions import decode_alone_refusal
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import SUPPORTED, SUPPORTED_RANGE, Release, is_supported, release

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


def _decode_alone_rule() -> Rule:
    """proxy.disaggregation threshold only where decode computes a plain request itself: the engines' vLLM
    line (engineVersion, else the image's) guards it in the transfer mode (``vllm_releases``)."""
    write = _cel_lines([r for r in SUPPORTED if r.plain_decode_guard_write])
    read = _cel_lines([r for r in SUPPORTED if r.plain_decode_guard_read])
    version = f"(has(self.engineVersion) ? self.engineVersion : '{PINNED_VLLM_VERSION}')"
    return Rule(
        cel="self.mode != 'disaggregated' || self.proxy.disaggregation.policy != 'threshold' || "
        f"(self.kvTransfer.transferMode == 'read' ? {version}.matches('{read}') : {version}.matches('{write}'))",
        message="proxy.disaggregation.policy threshold serves requests on decode alone, which the engines' vLLM "
        "(engineVersion, unset: the image's "
        f"{PINNED_VLLM_VERSION}) must compute itself: from 0.32 in write mode, from 0.33 in read mode; before, "
        "decode waits for KV forever (write) or decodes from KV it never loaded (read)",
        check=lambda s: (
            not s.disaggregated or s.proxy.disaggregation.policy != "threshold" or s.decode_alone_refusal() is None
        ),
        field_path=".proxy.disaggregation.policy",
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


def _mixed_tp_write_ok(spec: PDDeploymentSpec) -> bool:
    a, b = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    if not spec.disaggregated or spec.kv_transfer.transfer_mode != "write" or a == b:
        return True
    return spec.vllm_release.heterogeneous_tp_write and max(a, b) % min(a, b) == 0


def _mixed_tp_write_rule() -> Rule:
    """Write mode between prefill and decode of different TP sizes needs vLLM 0.33's TP mapping.

    Before it each prefill rank writes one decode rank and each decode rank completes on one write_done
    (0.31 ``get_moriio_remote_tp_rank``), so decode ranks without a writer wait for good; 0.33's
    ``moriio_tp_mapping.validate_write_tp_topology`` needs one TP size to be a multiple of the other.
    """
    lines = [r.name for r in SUPPORTED if r.heterogeneous_tp_write]
    regex = "^(" + "|".join(line.replace(".", "[.]") for line in lines) + ")[.]"
    pinned = str(release(PINNED_VLLM_VERSION).heterogeneous_tp_write).lower()
    a, b = "self.prefill.tensorParallelSize", "self.decode.tensorParallelSize"
    return Rule(
        cel=f"self.mode != 'disaggregated' || self.kvTransfer.transferMode != 'write' || {a} == {b} || "
        f"((has(self.engineVersion) ? self.engineVersion.matches('{regex}') : {pinned}) && "
        f"({a} % {b} == 0 || {b} % {a} == 0))",
        message="write mode with prefill.tensorParallelSize != decode.tensorParallelSize needs vLLM "
        f"{lines[0]} or later (engineVersion; unset: the image's {PINNED_VLLM_VERSION}) and one TP size a "
        "multiple of the other: earlier releases write each prefill rank's KV into one decode rank only, and "
        "the decode ranks without a writer wait for good",
        check=_mixed_tp_write_ok,
        field_path=".decode.tensorParallelSize",
    )


_CEL_RESOURCES = ("self.prefill.resources", "self.decode.resources", "self.proxy.resources")


def _cel_no_compute_limits(res: str) -> str:
    return f"(!has({res}.limits) || (!('cpu' in {res}.limits) && !('memory' in {res}.limits)))"


ReleaseVersion = Annotated[str, StringConstraints(max_length=32, pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]


def _cel_lines(releases: list[Release]) -> str:
    """A CEL regex of a version of these lines: "0[.]31", "0[.]32", ... then the patch number."""
    return "^(" + "|".join(r.name.replace(".", "[.]") for r in releases) + ")[.][0-9]+$"


# engineVersion's supported lines as a CEL regex.
_CEL_SUPPORTED_VERSION = _cel_lines(list(SUPPORTED))


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
    engine_version: ReleaseVersion | None = Field(
        None,
        description=(
            f"The vLLM release the image runs (major.minor.patch, a supported line: {SUPPORTED_RANGE}); unset = "
            f"the default image's, {PINNED_VLLM_VERSION}. It decides which flags and --kv-transfer-config keys "
            "are rendered and what admission allows; each engine's launcher refuses to start when the installed "
            "vLLM is another release (PreflightFailed, both versions named). Simulated engines reproduce it."
        ),
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

    def decode_alone_refusal(self) -> str | None:
        """Why the proxy may not serve requests on decode alone (proxy.disaggregation threshold), if so."""
        return decode_alone_refusal(self.vllm_version, self.kv_transfer.transfer_mode == "read")

    _rules = (
        Rule(
            cel=f"!has(self.engineVersion) || self.engineVersion.matches('{_CEL_SUPPORTED_VERSION}')",
            message=f"engineVersion must be a release of a supported vLLM line ({SUPPORTED_RANGE}, e.g. "
            f"{PINNED_VLLM_VERSION}): the operator renders each line's own flags and kv-transfer keys",
            check=lambda s: s.engine_version is None or is_supported(s.engine_version),
            field_path=".engineVersion",
        ),
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
        _mixed_tp_write_rule(),
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
        _decode_alone_rule(),
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
    def vllm_version(self) -> str:
        """The vLLM release the engines run: the declared one, else the default image's."""
        return self.engine_version or PINNED_VLLM_VERSION

    @property
    def vllm_release(self) -> Release:
        """What that release accepts and its connector does (pd_runtime.vllm_releases)."""
        return release(self.vllm_version)

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
