"""How the deployment serves and is measured: the proxy, the router, rollouts, the NetworkPolicy, the
InferencePool, the goodput probe with its SLO, autotuning and autoscaling.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from pd_operator.api.shared import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_PROXY_PORT,
    MAX_REPLICAS,
    ApiModel,
    Arg,
    Checked,
    Port,
    Resources,
    SecretKeyRef,
)
from pd_operator.rules import Rule, ValueRule, cel_list
from pd_runtime import protocol

# `pdctl proxy` flags the operator renders for the pod's isolation; the proxy's extraArgs come last and would win.
# pdctl proxy spells each flag one way (no prefixes: allow_abbrev=False), and as --flag=value.
PROXY_MANAGED_FLAGS = (
    "--host",  # where clients reach it: the Service and the probes
    "--port",
    "--registration-address",  # the engines' registrations, on loopback
    "--expected-engine",  # the only registrations it counts: the engines the operator rendered
    "--max-instances",
    "--engine",  # where prompts go
    "--engine-host",
    "--admin-host",  # status and drain, for the operator and the router
    "--admin-port",
    "--api-key-env",  # where the clients' and the engines' keys come from
    "--engine-api-key-env",
    "--config-file",  # the operator's settings file (routing, timeouts, limits), reloaded while it runs
    "--router",  # another program: the router in front of replicas
)
_NOT_MANAGED_BY_PROXY = ValueRule(
    cel=f"!(self.split('=')[0] in {cel_list(PROXY_MANAGED_FLAGS)})",
    check=lambda word: word.split("=", 1)[0] not in PROXY_MANAGED_FLAGS,
    subject_cel="self.split('=')[0]",
    subject=lambda word: word.split("=", 1)[0],
    message="is managed by the operator: a pdctl proxy flag of the addresses, engines or keys it renders "
    "(docs/security.md lists them)",
    summary="extraArgs must not set a pdctl proxy flag of the addresses, engines or keys the operator renders "
    "(docs/security.md lists them)",
)
ProxyArg = Annotated[Arg, Checked(_NOT_MANAGED_BY_PROXY)]

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


class ProxyTimeouts(ApiModel):
    """Proxy timeouts in seconds; unset ones keep the proxy's defaults (which never cut a healthy stream).
    responseSeconds is each request's one deadline; the others end a phase inside it sooner."""

    connect_seconds: float | None = Field(None, gt=0, le=3600, description="Connecting to an engine.")
    prefill_seconds: float | None = Field(
        None, gt=0, le=86400, description="Whole prefill leg; past it the engine is taken as hung (502)."
    )
    decode_first_byte_seconds: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="Until the decode leg's first byte (and the longest wait for a decode slot); past it the "
        "engine is taken as hung (502).",
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
    response_seconds: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="Each request's one deadline (default 1800): from its arrival through the admission queue, "
        "routing, both legs, a failover and the whole answer, streamed or not; past it 504, or an error event "
        "once the stream has begun.",
    )


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


class ProxyDisaggregation(ApiModel):
    """Disaggregated mode: which requests go through prefill and decode, and which to decode alone
    (docs/proxy.md, "Selective disaggregation"; reloaded: no restart)."""

    policy: Literal["always", "threshold"] = Field(
        "always",
        description=(
            "always: every request through prefill and decode. threshold: a prompt of fewer than thresholdTokens "
            "tokens, or whose part the decode engine has not cached is, goes to decode alone as one plain request "
            "(no prefill leg, no KV transfer: a shorter TTFT, at the cost of that prompt's prefill on decode). "
            "Only for engines whose decode computes a plain request itself: vLLM 0.32 and later in write mode, "
            "0.33 and later in read mode; refused for others, naming the version."
        ),
    )
    threshold_tokens: int = Field(
        256,
        ge=1,
        le=1048576,
        description=(
            "policy threshold: prompts (or their uncached part) below this many tokens are served on decode alone. "
            "Token-id prompts count exactly; the proxy has no tokenizer, so text counts 4 ASCII characters, or "
            "one other character, a token."
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
    disaggregation: ProxyDisaggregation = Field(
        default_factory=ProxyDisaggregation,
        description="Which requests skip prefill and are served on decode alone (disaggregated mode).",
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
    migration_limit: int = Field(
        1,
        ge=0,
        le=16,
        description=(
            "Disaggregated mode: how many times a streamed completion whose decode engine dies (or whose decode "
            "stream breaks) after tokens reached the client continues on another routable decode engine (xPyD, "
            "or another replica's behind the router): the prompt plus the tokens already streamed go out as a "
            "new P/D request, spliced so the client sees one response with no token twice or missing; a greedy "
            "request gives the tokens it would have given. 0: such a stream ends with an error event."
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
    extra_args: list[ProxyArg] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "More `pdctl proxy` arguments, appended verbatim. Flags of the addresses, engines and keys the "
            "operator renders (--registration-address, --expected-engine, --engine, --admin-port, --api-key-env, "
            "...: docs/security.md lists them) are refused, as --flag and --flag=value (pdctl proxy takes no "
            "prefixes)."
        ),
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
