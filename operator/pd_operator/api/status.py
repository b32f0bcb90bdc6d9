"""The status the operator writes (PDDeploymentStatus and its parts) and the PDDeployment object."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from pd_operator.api.shared import MAX_REPLICAS, MAX_ROLE_INSTANCES, RUN_PROBE_ANNOTATION, ApiModel
from pd_operator.api.spec import PDDeploymentSpec

Timestamp = Annotated[str, StringConstraints(max_length=64)]
ReleaseText = Annotated[str, StringConstraints(max_length=64)]


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
    engine_version: ReleaseText | None = Field(
        None,
        description="The vLLM release this engine runs (engines only), as its GET /version answers it to the "
        "pod's proxy, e.g. 0.31.0+rocm723; unset until the proxy has read it.",
    )


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


MetricName = Annotated[str, StringConstraints(max_length=64)]
MAX_ENGINE_COUNTERS = 8


class EngineTransferStatus(ApiModel):
    """vLLM's own MoRI-IO failure counters over a replica's engines, under vLLM's names
    (``vllm:moriio_num_failed_transfers``, ``vllm:moriio_num_failed_notifications``,
    ``vllm:moriio_num_kv_expired_reqs``): vLLM's main branch exports them, no release through 0.34 does."""

    totals: dict[MetricName, int] = Field(
        default_factory=dict,
        max_length=MAX_ENGINE_COUNTERS,
        description="Each counter summed over the replica's engines as its proxy last read them (since each "
        "engine started).",
    )
    since_probe: dict[MetricName, int] = Field(
        default_factory=dict,
        max_length=MAX_ENGINE_COUNTERS,
        description="How much each counter grew since the last goodput probe's result arrived (probeTime); a "
        "counter that went down (an engine restarted) counts from the restart.",
    )
    at_probe: dict[MetricName, int] = Field(
        default_factory=dict,
        max_length=MAX_ENGINE_COUNTERS,
        description="The totals sinceProbe counts from: as first read after that probe's result arrived (0 for "
        "a pod first read later, or before any probe).",
    )
    probe_time: Timestamp | None = Field(
        None, description="The status.goodput.time of the probe sinceProbe counts from; unset: none yet."
    )


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
    engine_versions: dict[Annotated[str, StringConstraints(max_length=63)], ReleaseText] = Field(
        default_factory=dict,
        max_length=2 * MAX_ROLE_INSTANCES,
        description="Engine container -> the vLLM release it runs, as its proxy read it (GET /version).",
    )
    engine_transfer: EngineTransferStatus | None = Field(
        None,
        description="Transfer failures and expired KV by vLLM's own counters, since the last goodput probe; unset "
        "while the engines export none (every vLLM release through 0.34).",
    )


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
    engine_version: Annotated[str, StringConstraints(max_length=256)] = Field(
        "",
        description="The vLLM releases the engines run, over every replica, as their proxies read them, e.g. "
        '"0.31.0+rocm723" (several, comma-separated, while a rollout changes it; column VLLM, -o wide); empty '
        "until read. spec.engineVersion is what they must run (the launcher refuses another).",
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
