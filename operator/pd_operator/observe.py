"""Pure: what the operator sees (layout, pod, proxy /status, probe result) -> the typed PDDeployment status.

Nothing here talks to the API server. The status is an :class:`api.PDDeploymentStatus`, the very model
the CRD schema is generated from, so a key the operator writes cannot be missing from the schema; it
goes on the wire only through :func:`wire` and :func:`merge_patch`. Every condition is built from its
entry in ``conditions.py``; ``Ready`` is a condition set (after KServe's ``conditionSet``): it is True
exactly when every condition that table says gates it is True.
Each replica (serving pod) is observed on its own, as if it were alone; the deployment's phase and
conditions are those of its one replica, or with several replicas their summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pd_operator.api import (
    AutotuneStatus,
    Condition,
    ConditionStatus,
    EngineTransferStatus,
    GoodputStatus,
    GpuAssignment,
    PDDeploymentSpec,
    PDDeploymentStatus,
    Phase,
    ReplicaStatus,
    RoleGpus,
    RoleStatus,
    RouterStatus,
)
from pd_operator.conditions import (
    CHILDREN_ADMITTED,
    GOODPUT_MET,
    KV_MISMATCH,
    KV_NOT_APPLICABLE,
    KV_TRANSFER_VERIFIED,
    NAME_CONFLICT,
    NODE_LOST,
    NODE_NOT_READY,
    NOT_OWNED,
    PREFLIGHT_FAILED,
    PROXY_READY,
    PROXY_UNREACHABLE,
    READY,
    ROLE_READY,
    ROUTER_READY,
    SCALING_ACTIVE,
    SPEC_VALID,
    TUNED,
    ConditionKind,
    Reason,
    RoleReason,
    ready_gates,
)
from pd_operator.engine_transfer import engine_transfer, replica_totals
from pd_operator.layout import EngineInstance, Layout
from pd_operator.refusals import Refusal
from pd_operator.render import DRA_CLAIM, PROXY_CONTAINER, router_name, selector_string
from pd_operator.views import MESSAGE_LIMIT, ClaimView, ContainerView, DeploymentView, PodView

Obj = dict[str, Any]
CRASH_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)
CHILD_REFUSED = "ChildRefused"  # the Event of a refused child (ChildrenAdmitted False, not NameConflict or NotOwned)
# `pdctl engine` exits with this code (EX_CONFIG) when its preflight refuses to start the engine; its
# reason is the container's termination message (pd_runtime.launcher.EXIT_PREFLIGHT_FAILED).
PREFLIGHT_EXIT_CODE = 78
RELEASE_LIMIT = 64  # a vLLM release as the engine names it, e.g. 0.31.0+rocm723 (status' ReleaseText)


@dataclass(frozen=True)
class ProxyReport:
    """The proxy admin ``GET /status`` document (contract 3), or why it could not be read."""

    status: Mapping[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class RouterRead:
    """The router Deployment as read this reconcile: its view, or none (not created yet, or the read ``failed``)."""

    deployment: DeploymentView | None = None
    failed: bool = False


@dataclass(frozen=True)
class NodeTrouble:
    """A serving pod's node is not Ready (`taint` names how), and when the pod is given up on it."""

    node: str
    pod: str
    taint: str  # node.kubernetes.io/not-ready or node.kubernetes.io/unreachable
    since: str  # RFC 3339: when the node's Ready condition left True
    grace_s: float  # math.inf: the pod tolerates the taint forever
    lost: bool  # past the grace now: the pod is force-deleted

    @property
    def state(self) -> str:
        return "NotReady" if self.taint.endswith("not-ready") else "unreachable"

    @property
    def message(self) -> str:
        where = f"node {self.node} is {self.state} since {self.since}"
        if self.lost:
            return (
                f"{where}, past the {self.grace_s:g}s grace: the serving pod {self.pod} is force-deleted "
                "(zero grace) and recreated on a node with free GPUs"
            )
        if math.isinf(self.grace_s):
            return f"{where}; the pod {self.pod} tolerates {self.taint} forever, so it is not replaced"
        return f"{where}; the serving pod {self.pod} is replaced {self.grace_s:g}s after that"


@dataclass(frozen=True)
class ReplicaObservation:
    """One replica: its serving pod as decided this tick (None: none yet) and its proxy's report."""

    index: int = 0
    pod: PodView | None = None
    current: bool = True  # the pod runs the current spec
    error: str | None = None  # why the pod could not be created or deleted
    proxy: ProxyReport | None = None
    node: NodeTrouble | None = None  # the pod's node is not Ready


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from; ``previous`` is the status as stored."""

    generation: int
    now: str
    spec: PDDeploymentSpec | None
    layout: Layout | None = None  # None exactly when the spec is invalid
    spec_problems: Sequence[str] = ()
    spec_reason: str = "InvalidSpec"  # SpecValid's reason with spec_problems: the tenancy policy's rule, if one
    replicas: Sequence[ReplicaObservation] = (ReplicaObservation(),)  # one per spec.replicas, by index
    surplus: int = 0  # serving pods beyond spec.replicas, being deleted (scale-down)
    previous: PDDeploymentStatus = field(default_factory=PDDeploymentStatus)
    goodput: GoodputStatus | None = None  # a fresh probe result; None keeps the previous one
    refusals: Sequence[Refusal] = ()  # child writes the API server refused this time
    children_written: bool = True  # every applied child was written this time (drift repair)
    autotune: AutotuneStatus | None = None  # autotuning's state (spec.autotune), as decided this time
    claims: Mapping[str, ClaimView] = field(default_factory=dict)  # ResourceClaim name -> what it was allocated
    router: RouterRead | None = None  # the router Deployment, read with spec.router.enabled (None: not read)


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


# ---- the condition set of Ready -------------------------------------------------------------------------


@dataclass(frozen=True)
class ConditionSet:
    """The happy condition is True exactly when every dependent condition is True."""

    happy: str
    dependents: tuple[str, ...]

    def satisfied(self, conditions: Sequence[Condition]) -> bool:
        status = {c.type: c.status for c in conditions}
        return all(status.get(kind) == "True" for kind in self.dependents)


def ready_set(layout: Layout) -> ConditionSet:
    """Ready = the conditions that gate it (conditions.py) for this pod: SpecValid and its roles' readiness."""
    roles = {e.role for e in layout.engines} | {"proxy"}
    return ConditionSet(READY.type, tuple(kind.type for kind in ready_gates(roles)))


# ---- containers ------------------------------------------------------------------------------------------


def _members(layout: Layout) -> list[tuple[str, Literal["prefill", "decode", "engine", "proxy"]]]:
    """(container name, role) of the serving pod."""
    return [(e.name, e.role) for e in layout.engines] + [(PROXY_CONTAINER, "proxy")]


def _gpus(layout: Layout, name: str) -> RoleGpus | None:
    eng = layout.engine(name)
    if eng is None:
        return None
    if layout.gpu_strategy == "none":
        return RoleGpus(count=0)
    pinned = layout.gpu_strategy in ("hostDevices", "dra")
    return RoleGpus(count=len(eng.gpus), devices=eng.gpu_range if pinned else None)


def preflight_refusals(pod: PodView | None) -> dict[str, str]:
    """Container name -> the launcher's refusal, for engines whose latest run ended in a failed preflight."""
    return {
        c.name: c.ended_message.strip() or "the engine preflight failed"
        for c in (pod.containers if pod else ())
        if c.exit_code == PREFLIGHT_EXIT_CODE
    }


def role_statuses(layout: Layout, pod: PodView | None, versions: Mapping[str, str] | None = None) -> list[RoleStatus]:
    out = []
    for name, role in _members(layout):
        cs = (pod.container(name) if pod else None) or ContainerView(name)
        out.append(
            RoleStatus(
                name=name,
                role=role,
                ready=cs.ready,
                started=cs.started,
                restart_count=cs.restart_count,
                state=cs.state,
                reason=cs.reason,
                message=cs.message,
                gpus=_gpus(layout, name),
                engine_version=(versions or {}).get(name),
            )
        )
    return out


_GPU_NOTES = {
    "devicePlugin": "the device plugin chose the devices; each container sees its GPUs as 0..N-1",
    "hostDevices": "pinned to physical indices through CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES",
    "dra": "pinned by PCI address through the ResourceClaimTemplate",
    "none": "simulated engines reserve no GPUs",
}


def gpu_assignment(
    layout: Layout, pod: PodView | None = None, claims: Mapping[str, ClaimView] | None = None
) -> GpuAssignment:
    """What the engines got: for dra, what the pod's ResourceClaim was allocated, read back from it."""
    strategy = layout.gpu_strategy
    claim = None
    if strategy == "dra" and pod is not None and (name := pod.claims.get(DRA_CLAIM)):
        claim = (claims or {}).get(name, ClaimView(name))

    def shown(engines: Sequence[EngineInstance]) -> str:
        if strategy == "none" or not engines:
            return "-"
        if strategy == "dra":
            names = {e.name for e in engines}
            allocated = [d.device for d in (claim.devices if claim else ()) if d.request in names]
            return ",".join(allocated) or "-"
        if strategy == "hostDevices":
            return ", ".join(e.gpu_range for e in engines)
        return "+".join(str(len(e.gpus)) for e in engines) + " (plugin-chosen)"

    def of_role(role: str) -> list[EngineInstance]:
        return [e for e in layout.engines if e.role == role]

    note = _GPU_NOTES[strategy]
    if strategy == "dra":
        if claim is None:
            note = "waiting for the pod's ResourceClaim"
        elif not claim.devices:
            note = f"ResourceClaim {claim.name} is not allocated yet"
        else:
            pools = ", ".join(sorted({d.pool for d in claim.devices}))
            note = f"allocated by ResourceClaim {claim.name} (pool {pools}), selected by PCI address"
    return GpuAssignment(
        strategy=strategy,
        note=note,
        prefill=shown(of_role("prefill")),
        decode=shown(of_role("decode")),
        engines=[shown([e]) for e in of_role("engine")],
        claim=claim.name if claim else None,
        allocated=list(claim.devices) if claim else [],
    )


# ---- phase ------------------------------------------------------------------------------------------------


def _trouble(roles: Sequence[RoleStatus]) -> list[str]:
    """Containers that crashed or cannot start, with their reason and last message."""
    found = []
    for r in roles:
        if r.reason in CRASH_REASONS or (r.restart_count > 0 and not r.ready):
            detail = f": {r.message}" if r.message else ""
            found.append(f"{r.name} {r.reason or 'restarted'} (restarts {r.restart_count}){detail}")
    return found


def phase_of(rep: ReplicaObservation, roles: Sequence[RoleStatus], ready: bool) -> tuple[Phase, str]:
    """The phase of one replica and why; ``ready`` is whether its Ready condition set is satisfied."""
    pod = rep.pod
    if rep.error:
        return ("Pending" if pod is None else "Progressing"), rep.error
    if rep.node is not None:
        return ("Progressing" if rep.node.lost else "Degraded"), rep.node.message
    if pod is None:
        return "Pending", "creating the serving pod"
    if pod.deleting:
        return "Progressing", "the serving pod is terminating"
    if not rep.current:
        return "Progressing", "rolling the serving pod to the new spec"
    if pod.ended:
        return "Failed", f"the serving pod ended ({pod.reason or pod.phase}); it will be recreated"
    if not pod.scheduled:
        return "Pending", pod.scheduling_message or "waiting for the scheduler"
    if ready:
        return "Ready", "all containers are ready"
    trouble = _trouble(roles)
    if trouble:
        return "Degraded", "; ".join(trouble)[:MESSAGE_LIMIT]
    waiting = [r.name for r in roles if not r.ready]
    return "Progressing", "waiting for " + ", ".join(waiting)


# ---- conditions -------------------------------------------------------------------------------------------


def condition(kind: ConditionKind[Reason], ok: bool | None, reason: Reason, message: str) -> Condition:
    """A condition of the kind the table declares, with one of its reasons."""
    status: ConditionStatus = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=kind.type, status=status, reason=reason, message=message[:MESSAGE_LIMIT])


def _pod_not_usable(rep: ReplicaObservation) -> tuple[RoleReason, str] | None:
    """Why no container of the serving pod can count as ready for the current spec, if so."""
    if rep.pod is None:
        return "NoPod", "the serving pod does not exist yet"
    if rep.pod.deleting:
        return "PodTerminating", "the serving pod is terminating"
    if not rep.current:
        return "PodOutdated", "the serving pod runs an older spec"
    return None


def _role_condition(
    kind: ConditionKind[RoleReason],
    roles: Sequence[RoleStatus],
    blocked: tuple[RoleReason, str] | None,
    refusals: Mapping[str, str],
) -> Condition:
    if blocked:
        return condition(kind, False, *blocked)
    refused = [f"{r.name}: {refusals[r.name]}" for r in roles if r.name in refusals]
    if refused:
        return condition(kind, False, PREFLIGHT_FAILED, "; ".join(refused))
    not_ready = [r.name for r in roles if not r.ready]
    # Several engines of a role: the counts first, so that `kubectl describe` answers "how many" at a glance.
    counted = (
        f"{len(roles) - len(not_ready)}/{len(roles)} ready; " if len(roles) > 1 and kind is not PROXY_READY else ""
    )
    if not not_ready:
        return condition(kind, True, "ContainersReady", counted + ", ".join(r.name for r in roles) + " ready")
    return condition(kind, False, "ContainersNotReady", counted + "not ready: " + ", ".join(not_ready))


def find(conditions: Sequence[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def previous_replica(previous: PDDeploymentStatus, index: int) -> ReplicaStatus | None:
    return next((r for r in previous.replica_statuses if r.index == index), None)


def _same_pod(prior: ReplicaStatus | None, pod: PodView | None) -> bool:
    return prior is not None and pod is not None and bool(pod.uid) and pod.uid == prior.pod_uid


def _kept_kv(prior: ReplicaStatus | None, pod: PodView | None) -> Condition | None:
    """The KVTransferVerified this very pod had last time, if any."""
    return prior.kv_transfer if prior is not None and _same_pod(prior, pod) else None


def kv_transfer_verified(prior: ReplicaStatus | None, pod: PodView | None) -> bool:
    """Already verified for this very pod: no need to ask its proxy again."""
    kept = _kept_kv(prior, pod)
    return kept is not None and kept.status == "True"


def engine_versions(layout: Layout, rep: ReplicaObservation, prior: ReplicaStatus | None) -> dict[str, str]:
    """Engine container -> the vLLM release it runs, as the replica's proxy read it (each instance's
    ``vllm_version`` in its /status, matched by HTTP port); what this very pod showed before for those the
    proxy did not report this time (it is read only while something is left to verify)."""
    versions = dict(prior.engine_versions) if _same_pod(prior, rep.pod) and prior is not None else {}
    status = rep.proxy.status if rep.proxy is not None else None
    instances = status.get("instances") if status is not None else None
    by_port: dict[str, str] = {}
    for inst in instances if isinstance(instances, list) else ():
        address = inst.get("http_address") if isinstance(inst, Mapping) else None
        version = inst.get("vllm_version") if isinstance(inst, Mapping) else None
        if isinstance(address, str) and isinstance(version, str) and version:
            by_port[address.rsplit(":", 1)[-1]] = version[:RELEASE_LIMIT]
    for eng in layout.engines:
        version = by_port.get(str(eng.ports[0][1]))  # its HTTP port comes first (EngineContainer.named_ports)
        if version is not None:
            versions[eng.name] = version
    return versions


def replica_engine_transfer(
    rep: ReplicaObservation, prior: ReplicaStatus | None, probe_time: str | None
) -> EngineTransferStatus | None:
    """status.replicaStatuses[].engineTransfer: vLLM's own failure counters from this read of the proxy, kept
    for this very pod while it is not read."""
    totals = replica_totals(rep.proxy.status if rep.proxy is not None else None)
    return engine_transfer(totals, prior.engine_transfer if _same_pod(prior, rep.pod) and prior else None, probe_time)


def engine_transfer_shown(prior: ReplicaStatus | None, pod: PodView | None) -> bool:
    """This very pod's engines export vLLM's transfer counters: its proxy is read every tick to follow them."""
    return _same_pod(prior, pod) and prior is not None and prior.engine_transfer is not None


def engine_versions_known(layout_engines: int, prior: ReplicaStatus | None, pod: PodView | None) -> bool:
    """Every engine of this very pod has shown its release: no need to ask its proxy for it again."""
    return _same_pod(prior, pod) and prior is not None and len(prior.engine_versions) >= layout_engines


def kv_mismatch(report: ProxyReport | None) -> Mapping[str, Any] | None:
    """The proxy canary's first KV mismatch (``/status.canary.kv_mismatch``), if it found one."""
    canary = report.status.get("canary") if report is not None and report.status is not None else None
    found = canary.get("kv_mismatch") if isinstance(canary, Mapping) else None
    return found if isinstance(found, Mapping) else None


def kv_transfer_condition(spec: PDDeploymentSpec, rep: ReplicaObservation, prior: ReplicaStatus | None) -> Condition:
    """True once the proxy saw one transfer id succeed on both legs; sticky for the life of the pod, unless
    the proxy's canary finds decode's tokens after a transfer differ from prefill's own: then False
    (KVMismatch) for as long as that proxy reports it, a True before it notwithstanding (fail closed)."""
    if not spec.disaggregated:
        return condition(
            KV_TRANSFER_VERIFIED, None, KV_NOT_APPLICABLE, "colocated mode moves no KV cache between engines"
        )
    kept = _kept_kv(prior, rep.pod)
    report = rep.proxy
    mismatch = kv_mismatch(report)
    if mismatch is not None and rep.pod is not None:
        message = f"the proxy's canary at {mismatch.get('at')}: {mismatch.get('message')}"
        return condition(KV_TRANSFER_VERIFIED, False, KV_MISMATCH, message)
    if kept is not None and kept.status == "True":
        return kept.model_copy()
    if kept is not None and kept.reason == KV_MISMATCH and (report is None or report.status is None):
        return kept.model_copy()  # an unreadable proxy clears nothing
    if report is None or rep.pod is None:
        return condition(KV_TRANSFER_VERIFIED, False, "NoProxy", "the proxy is not running yet")
    if report.status is None:
        if kept is not None and kept.reason == PROXY_UNREACHABLE:
            return kept.model_copy()  # a timeout after a refusal is no news: the first error's text stays
        return condition(KV_TRANSFER_VERIFIED, False, PROXY_UNREACHABLE, f"proxy admin /status: {report.error}")
    last = report.status.get("last_transfer")
    if not isinstance(last, Mapping):
        return condition(
            KV_TRANSFER_VERIFIED,
            False,
            "NoTransferYet",
            "waiting for a request whose prefill and decode legs both succeed",
        )
    message = (
        f"transfer {last.get('transfer_id')} from prefill {last.get('prefill')} to decode {last.get('decode')} "
        f"completed at {last.get('completed_at')} ({last.get('source')})"
    )
    return condition(KV_TRANSFER_VERIFIED, True, "TransferCompleted", message)


def children_refused(previous: PDDeploymentStatus) -> bool:
    found = find(previous.conditions, CHILDREN_ADMITTED.type)
    return found is not None and found.status == "False"


def children_condition(obs: Observation) -> Condition:
    """False while the API server refuses a child (pod, Service, NetworkPolicy, claim template, Job), naming
    the object, the policy and the fields; True once every child was written. A tick that wrote only some
    children keeps what the last full write found (a refusal makes every tick a full write)."""
    if obs.refusals:
        message = "; ".join(r.describe() for r in obs.refusals)
        return condition(CHILDREN_ADMITTED, False, obs.refusals[0].reason, message)
    kept = find(obs.previous.conditions, CHILDREN_ADMITTED.type)
    if kept is not None and not obs.children_written:
        return kept.model_copy()
    return condition(CHILDREN_ADMITTED, True, "Admitted", "the API server accepted every child")


def node_lost_condition(obs: Observation, phase: Phase) -> Condition | None:
    """Shown from the first time a serving pod's node is not Ready: True from the force-deletion until
    the replacements are Ready, then False (Recovered) until the next time; absent while nodes were fine."""
    troubles = [r.node for r in obs.replicas if r.node is not None]
    prior = find(obs.previous.conditions, NODE_LOST.type)
    if troubles:
        lost = [t for t in troubles if t.lost]
        message = "; ".join(t.message for t in lost or troubles)
        return condition(NODE_LOST, bool(lost), "NodeLost" if lost else NODE_NOT_READY, message)
    if prior is not None and prior.reason == NODE_NOT_READY:
        return condition(NODE_LOST, False, "NodeReady", "the nodes of the serving pods are Ready again")
    if prior is not None and prior.status == "True" and phase == "Ready":
        ready = "; ".join(f"the serving pod {r.pod.name} is Ready on node {r.pod.node}" for r in obs.replicas if r.pod)
        return condition(NODE_LOST, False, "Recovered", ready)
    return prior


def goodput_condition(spec: PDDeploymentSpec, goodput: GoodputStatus | None) -> Condition:
    kind = GOODPUT_MET
    if not spec.goodput_probe.enabled:
        return condition(kind, None, "ProbeDisabled", "spec.goodputProbe.enabled is false")
    if goodput is None:
        return condition(kind, None, "NoProbeYet", "the first probe runs once the deployment is Ready")
    slo = goodput.slo
    message = (
        f"attainment {goodput.attainment:.3f} at {goodput.rate:g} req/s "
        f"(TTFT <= {slo.ttft_ms:g} ms, ITL <= {slo.itl_ms:g} ms), target {slo.target:g}"
    )
    return condition(kind, goodput.met, "TargetMet" if goodput.met else "TargetMissed", message)


def tuned_conditions(spec: PDDeploymentSpec, state: AutotuneStatus | None) -> list[Condition]:
    """Tuned, only with spec.autotune.enabled (False while trials run, True once the best is in force)."""
    return [_tuned(state)] if spec.autotune.enabled else []


def _tuned(state: AutotuneStatus | None) -> Condition:
    kind = TUNED
    if state is None or not state.trials:
        return condition(kind, False, "NoTrials", state.message if state else "planning the trials")
    if state.tuned is None:
        return condition(kind, False, "Trialing", state.message)
    return condition(kind, True, "Tuned", state.message)


def router_status(
    layout: Layout, read: RouterRead | None, previous: RouterStatus | None
) -> tuple[RouterStatus | None, Condition | None]:
    """status.router and RouterReady, with the router enabled only. True while at least one router pod is
    ready (the router's Service then answers); Unknown while its Deployment is missing or unreadable (then
    status.router keeps the counts last read)."""
    wanted = layout.router_replicas
    if not wanted:
        return None, None
    name = router_name(layout.owner)
    if read is None or read.failed:
        unread = f"the router Deployment {name} could not be read; the operator reads it again next time"
        return previous, condition(ROUTER_READY, None, "RouterUnreadable", unread)
    dep = read.deployment
    ready = dep.ready_replicas if dep is not None else 0
    counts = RouterStatus(replicas=wanted, ready_replicas=ready, ready=f"{ready}/{wanted}")
    if dep is None:
        return counts, condition(
            ROUTER_READY, None, "RouterNotFound", f"the router Deployment {name} does not exist yet"
        )
    lag = "" if dep.observed else f" (its controller has not seen generation {dep.generation} of {name} yet)"
    if ready:
        return counts, condition(ROUTER_READY, True, "RouterAvailable", f"{counts.ready} router pods ready{lag}")
    message = f"{counts.ready} router pods ready: clients of {name} get no answer{lag}"
    return counts, condition(ROUTER_READY, False, "NoRouterPodReady", message)


def _with_transition_times(
    new: list[Condition], old: Sequence[Condition], now: str, generation: int
) -> list[Condition]:
    """A condition keeps its lastTransitionTime while its status stays the same."""
    out = []
    for cond in new:
        prior = find(old, cond.type)
        same = prior is not None and prior.status == cond.status and prior.last_transition_time
        since = prior.last_transition_time if same and prior else now
        out.append(cond.model_copy(update={"last_transition_time": since, "observed_generation": generation}))
    return out


def with_condition(
    status: PDDeploymentStatus, cond: Condition | None, previous: PDDeploymentStatus, now: str, generation: int
) -> PDDeploymentStatus:
    """``status`` with one more condition decided outside :func:`status` (spec.autoscaling's), if any."""
    if cond is None:
        return status
    kept = [c for c in status.conditions if c.type != cond.type]
    added = _with_transition_times([cond], previous.conditions, now, generation)
    return status.model_copy(update={"conditions": [*kept, *added]})


def _role_conditions(
    roles: Sequence[RoleStatus], blocked: tuple[RoleReason, str] | None, refusals: Mapping[str, str]
) -> list[Condition]:
    by_kind: dict[ConditionKind[RoleReason], list[RoleStatus]] = {}
    for r in roles:
        by_kind.setdefault(ROLE_READY[r.role], []).append(r)
    return [_role_condition(kind, members, blocked, refusals) for kind, members in by_kind.items()]


# ---- status and events --------------------------------------------------------------------------------------


def _invalid(obs: Observation) -> PDDeploymentStatus:
    """An invalid spec changes phase, message and SpecValid; everything else stays as it was."""
    phase, message = "Failed", "invalid spec: " + "; ".join(obs.spec_problems)
    invalid = condition(SPEC_VALID, False, obs.spec_reason, "; ".join(obs.spec_problems))
    kept = [c for c in obs.previous.conditions if c.type != SPEC_VALID.type]
    conds = _with_transition_times([invalid, *kept], obs.previous.conditions, obs.now, obs.generation)
    return obs.previous.model_copy(update={"phase": phase, "message": message[:MESSAGE_LIMIT], "conditions": conds})


@dataclass(frozen=True)
class ReplicaFacts:
    """One replica observed as if it were alone: what the deployment's status summarises."""

    obs: ReplicaObservation
    roles: list[RoleStatus]
    role_conditions: list[Condition]
    phase: Phase
    message: str
    kv: Condition
    ready: bool  # serving: the pod exists, is not going away, every container is ready (any spec version)
    status: ReplicaStatus


def replica_available(spec: PDDeploymentSpec, ready: bool, kv: Condition) -> bool:
    """Counts as serving for a rollout: ready and, when disaggregated, its KV transfer verified."""
    return ready and (not spec.disaggregated or kv.status == "True")


def replica_facts(
    spec: PDDeploymentSpec,
    layout: Layout,
    rep: ReplicaObservation,
    previous: PDDeploymentStatus,
    probe_time: str | None = None,
) -> ReplicaFacts:
    """``probe_time``: when the last goodput probe finished (engineTransfer counts from it)."""
    pod = rep.pod
    prior = previous_replica(previous, rep.index)
    versions = engine_versions(layout, rep, prior)
    roles = role_statuses(layout, pod, versions)
    role_conds = _role_conditions(roles, _pod_not_usable(rep), preflight_refusals(pod))
    valid = condition(SPEC_VALID, True, "Valid", "the spec passed validation")
    phase, message = phase_of(rep, roles, ready_set(layout).satisfied([valid, *role_conds]))
    kv = kv_transfer_condition(spec, rep, prior)
    ready = pod is not None and not pod.deleting and not pod.ended and all(r.ready for r in roles)
    status = ReplicaStatus(
        index=rep.index,
        pod_name=pod.name if pod else "",
        pod_uid=pod.uid if pod else None,
        pod_ip=pod.ip if pod else None,
        node_name=pod.node if pod else None,
        phase=phase,
        message=message[:MESSAGE_LIMIT],
        ready=f"{sum(r.ready for r in roles)}/{len(roles)}",
        current=rep.current and pod is not None and not pod.deleting,
        available=replica_available(spec, ready, kv),
        kv_transfer=kv.model_copy(update={"last_transition_time": None, "observed_generation": None}),
        engine_versions=versions,
        engine_transfer=replica_engine_transfer(rep, prior, probe_time),
    )
    return ReplicaFacts(rep, roles, role_conds, phase, message, kv, ready, status)


def _summary_condition(per: Sequence[ReplicaFacts], conds: Sequence[Condition], worst: str = "") -> Condition:
    """One condition over several replicas, with the reason of a replica's: True when True on each; else
    the replicas that hold it back, those with reason ``worst`` first (the first one's reason is the summary's)."""
    failing = [(f, c) for f, c in zip(per, conds, strict=True) if c.status != "True"]
    failing.sort(key=lambda item: item[1].reason != worst)
    if not failing:
        return conds[0].model_copy(update={"message": f"on all {len(per)} replicas"})
    detail = "; ".join(f"{f.status.pod_name or f'replica {f.obs.index}'}: {c.message}" for f, c in failing)
    message = f"{len(per) - len(failing)}/{len(per)} replicas: {detail}"
    return failing[0][1].model_copy(update={"status": "False", "message": message[:MESSAGE_LIMIT]})


def _summary_phase(per: Sequence[ReplicaFacts], surplus: int) -> tuple[Phase, str]:
    if len(per) == 1 and not surplus:
        return per[0].phase, per[0].message
    phases = {f.phase for f in per}
    waiting = [f"{f.status.pod_name or f'replica {f.obs.index}'}: {f.message}" for f in per if f.phase != "Ready"]
    if surplus:
        waiting.append(f"scaling down: {surplus} surplus pod(s) terminating")
    if not waiting:
        return "Ready", f"all {len(per)} replicas are ready"
    phase: Phase = (
        "Degraded" if phases & {"Degraded", "Failed"} else "Pending" if phases == {"Pending"} else "Progressing"
    )
    ready = sum(f.phase == "Ready" for f in per)
    return phase, f"{ready}/{len(per)} replicas ready; " + "; ".join(waiting)


def _summary_conditions(per: Sequence[ReplicaFacts]) -> tuple[list[Condition], Condition]:
    """The role conditions and KVTransferVerified of the deployment: the one replica's, or a summary."""
    if len(per) == 1:
        return per[0].role_conditions, per[0].kv
    by_kind: dict[str, list[Condition]] = {}
    for f in per:  # every replica has the same roles: one layout
        for c in f.role_conditions:
            by_kind.setdefault(c.type, []).append(c)
    roles = [_summary_condition(per, conds) for conds in by_kind.values()]
    kv = per[0].kv
    if kv.reason != KV_NOT_APPLICABLE:
        kv = _summary_condition(per, [f.kv for f in per], KV_MISMATCH)
    return roles, kv


def status(obs: Observation) -> PDDeploymentStatus:
    """The status the operator owns (the probe bookkeeping is the caller's, and kept as it was)."""
    if obs.spec is None or obs.layout is None:
        return _invalid(obs)
    spec, layout = obs.spec, obs.layout
    goodput = obs.goodput or obs.previous.goodput
    probe_time = goodput.time if goodput is not None else None
    per = [replica_facts(spec, layout, rep, obs.previous, probe_time) for rep in obs.replicas]
    first = per[0]
    role_conds, kv = _summary_conditions(per)
    conds = [condition(SPEC_VALID, True, "Valid", "the spec passed validation"), *role_conds]
    phase, message = _summary_phase(per, obs.surplus)
    conds.append(condition(READY, phase == "Ready", phase, "serving" if phase == "Ready" else "not serving"))
    conds += [kv, goodput_condition(spec, goodput), children_condition(obs), *tuned_conditions(spec, obs.autotune)]
    if (node_lost := node_lost_condition(obs, phase)) is not None:
        conds.append(node_lost)
    router, router_ready = router_status(layout, obs.router, obs.previous.router)
    if router_ready is not None:
        conds.append(router_ready)
    current = all(f.status.current for f in per)
    pod = first.obs.pod
    ready_replicas = sum(f.ready for f in per)
    return obs.previous.model_copy(
        update={
            "phase": phase,
            "message": message[:MESSAGE_LIMIT],
            "ready": f"{ready_replicas}/{len(per)}",
            "containers_ready": f"{sum(r.ready for f in per for r in f.roles)}/{sum(len(f.roles) for f in per)}",
            "replicas": sum(f.obs.pod is not None for f in per) + obs.surplus,
            "ready_replicas": ready_replicas,
            "updated_replicas": sum(f.status.current for f in per),
            "available_replicas": sum(f.status.available for f in per),
            "selector": selector_string(layout.owner),
            "replica_statuses": [f.status for f in per],
            "transfer": spec.transfer_in_effect,
            "engine_version": ", ".join(sorted({v for f in per for v in f.status.engine_versions.values()})),
            "pod_name": pod.name if pod else None,
            "pod_uid": pod.uid if pod else None,
            "pod_ip": pod.ip if pod else None,
            "node_name": pod.node if pod else None,
            "roles": first.roles,
            "gpu_assignment": gpu_assignment(layout, pod, obs.claims),
            "conditions": _with_transition_times(conds, obs.previous.conditions, obs.now, obs.generation),
            "goodput": goodput,
            "autotune": obs.autotune,
            "router": router,
            "observed_generation": obs.generation if current else obs.previous.observed_generation,
        }
    )


_PHASE_EVENT: dict[str, Literal["Normal", "Warning"]] = {
    "Pending": "Normal",
    "Progressing": "Normal",
    "Ready": "Normal",
    "Degraded": "Warning",
    "Failed": "Warning",
}


def events(old: PDDeploymentStatus, new: PDDeploymentStatus) -> list[Event]:
    """Events for a phase change and for condition flips that matter to users."""
    found: list[Event] = []
    if new.phase and new.phase != old.phase:
        found.append(Event(_PHASE_EVENT[new.phase], new.phase, new.message))
    before = {c.type: c.status for c in old.conditions}
    reasons_before = {c.type: c.reason for c in old.conditions}
    messages_before = {c.type: c.message for c in old.conditions}
    for cond in new.conditions:
        kind, value = cond.type, cond.status
        for reason in (PREFLIGHT_FAILED, NODE_NOT_READY, KV_MISMATCH):
            if cond.reason == reason and reasons_before.get(kind) != reason:
                found.append(Event("Warning", reason, cond.message))
        if kind == CHILDREN_ADMITTED.type and value == "False" and messages_before.get(kind) != cond.message:
            left_alone = cond.reason in (NAME_CONFLICT, NOT_OWNED)
            found.append(Event("Warning", cond.reason if left_alone else CHILD_REFUSED, cond.message))
        if (
            kind == SCALING_ACTIVE.type
            and value == "False"
            and (before.get(kind), reasons_before.get(kind))
            != (
                value,
                cond.reason,
            )
        ):
            found.append(Event("Warning", "ScalingInactive", cond.message))
        if before.get(kind) == value or value == "Unknown":
            continue
        if kind == SPEC_VALID.type and value == "False":
            found.append(Event("Warning", cond.reason, cond.message))
        elif kind == KV_TRANSFER_VERIFIED.type and value == "True":
            found.append(Event("Normal", KV_TRANSFER_VERIFIED.type, cond.message))
        elif kind == GOODPUT_MET.type:
            met = value == "True"
            found.append(Event("Normal" if met else "Warning", "GoodputMet" if met else "GoodputMissed", cond.message))
        elif kind == ROUTER_READY.type:
            up = value == "True"
            found.append(
                Event("Normal" if up else "Warning", ROUTER_READY.type if up else "RouterNotReady", cond.message)
            )
    return found


# ---- the wire -----------------------------------------------------------------------------------------------


def wire(status: PDDeploymentStatus) -> Obj:
    """The status as stored: camelCase keys (the CRD's), unset fields left out."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse(stored: Mapping[str, Any]) -> PDDeploymentStatus:
    """The stored status as a model; one the schema let through but the model refuses starts afresh."""
    try:
        return PDDeploymentStatus.model_validate(dict(stored))
    except ValueError:
        return PDDeploymentStatus()


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The JSON merge patch (RFC 7386) from ``old`` to ``new``: only what differs, null deletes a key.

    An empty patch for an unchanged status is what keeps a steady state at zero writes.
    """
    patch: Obj = {}
    for key in old.keys() | new.keys():
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = new[key]
        elif isinstance(old[key], Mapping) and isinstance(new[key], Mapping):
            nested = merge_patch(old[key], new[key])
            if nested:
                patch[key] = nested
        elif old[key] != new[key]:
            patch[key] = new[key]
    return patch
