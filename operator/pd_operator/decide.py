"""Pure: one reconciliation, decided at once. A snapshot of the world in; the status and the actions out.

The handlers gather a :class:`Snapshot` (the PDDeployment, its pods and probe Jobs from kopf's indexes,
the proxy's report, autotune's plan, the time), call :func:`decide`, execute the :data:`Action` list in order and write
the status patch. When an action fails they decide once more with the failures in the snapshot, so
that what the user sees (a status message, no "created" Event) follows from the same pure function.
The serving pods (one per replica, rolled at most ``rollout.maxUnavailable`` at a time, replaced when
their node is lost), the probe Job lifecycle (collect, record, delete, start) and drift repair of the
other children are all decided here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pd_operator import autoscale, autotune, goodput, layout, observe, render
from pd_operator.actions import Action, Adopt, Apply, Create, CreateSecret, Decision, Delete, Emit, Scale, refused
from pd_operator.api import (
    RUN_PROBE_ANNOTATION,
    AutoscalingStatus,
    Condition,
    DemandStatus,
    GoodputStatus,
    PDDeploymentSpec,
    PDDeploymentStatus,
    ProbeState,
)
from pd_operator.conditions import SCALING_ACTIVE
from pd_operator.layout import Layout
from pd_operator.observe import Event, NodeTrouble, Observation, ReplicaObservation
from pd_operator.ownership import (
    adoptable,
    as_object,
    conflict,
    controlled_by,
    holder,
    labelled,
    left_alone,
    owned,
    owner_confirmed,
    probe_jobs,
)
from pd_operator.refusals import Refusal
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError
from pd_operator.views import JobView, ObjectView, PodView, pod_view

Obj = dict[str, Any]
ERROR_LIMIT = 1024


# ---- the serving pods -----------------------------------------------------------------------------------

PodAction = Literal["create", "keep", "replace", "roll", "wait", "hold"]
_POD_EVENTS = {
    "create": Event("Normal", "CreatedPod", "created the serving pod"),
    "roll": Event("Normal", "RollingPod", "the spec changed: deleting the serving pod to recreate it"),
    "replace": Event("Warning", "ReplacingPod", "the serving pod ended: deleting it to recreate it"),
}


def pod_action(live: PodView | None, desired: Obj) -> PodAction:
    """What to do with a serving pod: create it, keep it, wait for it to go, or delete it to recreate."""
    if live is None:
        return "create"
    if live.deleting:
        return "wait"
    if live.ended:
        return "replace"
    wanted = desired["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH]
    return "keep" if live.annotations.get(render.ANNOTATION_SPEC_HASH) == wanted else "roll"


def _node_grace(setting_s: float, tolerated_s: float | None) -> float:
    """The operator's grace, shortened by the pod's own tolerationSeconds for the taint; a pod that
    tolerates the taint forever is never given up (math.inf), as the taint eviction controller keeps it."""
    if tolerated_s is None:
        return setting_s
    return tolerated_s if math.isinf(tolerated_s) else min(setting_s, tolerated_s)


def node_trouble(snap: Snapshot, live: PodView | None) -> NodeTrouble | None:
    """Whether a serving pod's node is NotReady or unreachable, and whether past the grace by now (then the
    pod is force-deleted: deleting, even evicted, it would wait forever for a kubelet that is gone)."""
    node = snap.nodes.get(live.node) if live is not None and live.node else None
    if live is None or node is None or node.loss_taint is None:
        return None
    since = goodput.parse_time(node.ready_since)
    if since is None:
        return None
    grace = _node_grace(snap.node_lost_grace_s, live.node_loss_tolerations.get(node.loss_taint))
    lost = (snap.now - since).total_seconds() >= grace
    return NodeTrouble(node.name, live.name, node.loss_taint, node.ready_since, grace, lost)


def rollout(verbs: Sequence[PodAction], available: Sequence[bool], max_unavailable: int) -> list[PodAction]:
    """Which outdated replicas roll now; the others ``hold`` (keep serving the previous spec).

    With one replica every roll goes ahead (recreate: a pod holds its node's GPUs, no surge is possible).
    With several, an outdated replica that serves (available: Ready and KV transfer verified) rolls only
    while fewer than ``max_unavailable`` replicas are out of service, counting every replica that is
    missing, terminating, ended, starting or not yet verified; the highest index goes first. An
    outdated replica that does not serve anyway rolls at once: holding it would protect nothing.
    """
    if len(verbs) <= 1:
        return list(verbs)
    serving = [a and v in ("keep", "roll") for v, a in zip(verbs, available, strict=True)]
    budget = max_unavailable - serving.count(False)
    out = list(verbs)
    for i in reversed(range(len(out))):
        if out[i] == "roll" and serving[i]:
            if budget > 0:
                budget -= 1
            else:
                out[i] = "hold"
    return out


@dataclass(frozen=True)
class PodStep:
    pod: PodView | None
    current: bool
    actions: tuple[Action, ...] = ()
    error: str | None = None


def _force_step(snap: Snapshot, live: PodView, trouble: NodeTrouble) -> PodStep:
    force = Delete("Pod", live.name, grace_seconds=0, uid=live.uid)
    if (failure := snap.failed.get(force.key)) is not None:
        why = refused(force.key, failure).describe()
        return PodStep(live, False, error=f"cannot force-delete the serving pod on lost node {trouble.node}: {why}")
    return PodStep(live, False, (force, Emit(Event("Warning", "NodeLost", trouble.message))))


def _pod_step(snap: Snapshot, desired: Obj, live: PodView | None, verb: PodAction, blocked: str | None) -> PodStep:
    if verb in ("keep", "wait", "hold"):
        return PodStep(live, verb == "keep")
    name = desired["metadata"]["name"]
    if verb == "create" and blocked is not None:
        return PodStep(live, False, error=f"the serving pod is not created: {blocked}")
    act: Action = Create(desired) if verb == "create" else Delete("Pod", name, uid=live.uid if live else None)
    failure = snap.failed.get(act.key)
    if failure is not None:
        return PodStep(live, False, error=f"cannot {verb} the serving pod: {refused(act.key, failure).describe()}")
    pod = pod_view(desired) if verb == "create" else live
    event = _POD_EVENTS[verb]
    return PodStep(pod, verb == "create", (act, Emit(Event(event.type, event.reason, f"{event.message} ({name})"))))


def _is_serving(pod: PodView) -> bool:
    return pod.labels.get(render.LABEL_COMPONENT) == render.COMPONENT_SERVING


def _serving_pods(snap: Snapshot) -> dict[str, PodView]:
    """The serving pods this PDDeployment controls, by name: the only ones it keeps, rolls or deletes."""
    return {p.name: p for p in snap.pods if _is_serving(p) and controlled_by(p.controller, snap.deployment.uid)}


def _orphans(snap: Snapshot, desired: Sequence[Obj]) -> dict[str, PodView]:
    """The orphan serving pods the adoption rule admits: no controller, this PDDeployment's labels, a replica's
    name and the spec hash that replica gets now. What `pdctl render | kubectl apply` made, or what deleting an
    earlier PDDeployment of this name with `--cascade=orphan` left; it serves as the operator's own would, so
    adopting one deletes and restarts nothing."""
    hashes = {o["metadata"]["name"]: o["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH] for o in desired}
    return {
        p.name: p
        for p in snap.pods
        if p.controller is None
        and p.uid
        and not p.deleting
        and _is_serving(p)
        and labelled(p.labels, snap.deployment)
        and p.name in hashes
        and p.annotations.get(render.ANNOTATION_SPEC_HASH) == hashes[p.name]
    }


def _adopt(snap: Snapshot, pod: PodView) -> Adopt:
    return Adopt("Pod", pod.name, pod.uid or "", render.owner_reference(snap.deployment.owner))


def _adopted(snap: Snapshot, desired: Sequence[Obj]) -> dict[str, PodView]:
    """The orphans adopted this time: only once this PDDeployment, read again, is confirmed; one whose adoption
    failed is not (the failure is ChildrenAdmitted's)."""
    if not owner_confirmed(snap):
        return {}
    return {n: p for n, p in _orphans(snap, desired).items() if _adopt(snap, p).key not in snap.failed}


@dataclass(frozen=True)
class ServingStep:
    replicas: tuple[ReplicaObservation, ...]
    surplus: int  # serving pods beyond spec.replicas, deleted (scale-down) or terminating
    actions: tuple[Action, ...]
    conflicts: tuple[Refusal, ...] = ()  # pods of another owner that hold a replica's name
    claimed: frozenset[str] = frozenset()  # the pods it controls, adopts or reports a name conflict with


def _serving_step(
    snap: Snapshot,
    spec: PDDeploymentSpec,
    lay: Layout,
    desired: Sequence[Obj],
    previous: PDDeploymentStatus,
    blocked: str | None = None,
) -> ServingStep:
    """Every replica's pod step, rolled per :func:`rollout`, and the deletion of pods beyond spec.replicas,
    over the pods it controls and the orphans it adopts now; no pod is created while ``blocked`` says why not
    (a child it needs is held by another owner), nor while a pod of another owner has its name."""
    adopted = _adopted(snap, desired)
    live = {**_serving_pods(snap), **adopted}
    names = [d["metadata"]["name"] for d in desired]
    held = {p.name: as_object("Pod", p) for p in snap.pods if p.name in names and p.name not in live}
    verbs = [pod_action(live.get(n), d) for n, d in zip(names, desired, strict=True)]
    available = [
        observe.replica_facts(
            spec, lay, ReplicaObservation(i, live.get(n), v == "keep", proxy=snap.proxies.get(n)), previous
        ).status.available
        for i, (n, v) in enumerate(zip(names, verbs, strict=True))
    ]
    verbs = rollout(verbs, available, spec.rollout.max_unavailable)
    replicas: list[ReplicaObservation] = []
    actions: list[Action] = []
    why = "it had no owner, and this PDDeployment's labels, name and spec hash"
    for orphan in adopted.values():
        adopting = Event("Normal", "AdoptedPod", f"adopted the serving pod {orphan.name}: {why}")
        actions += [_adopt(snap, orphan), Emit(adopting)]
    for i, (name, obj, verb) in enumerate(zip(names, desired, verbs, strict=True)):
        pod = live.get(name)
        trouble = node_trouble(snap, pod)
        if pod is not None and trouble is not None and trouble.lost:
            step = _force_step(snap, pod, trouble)
        else:
            step = _pod_step(snap, obj, pod, verb, holder(held[name]) if name in held else blocked)
        replicas.append(ReplicaObservation(i, step.pod, step.current, step.error, snap.proxies.get(name), trouble))
        actions += step.actions
    surplus = [p for n, p in sorted(live.items()) if n not in names]
    for pod in surplus:
        trouble = node_trouble(snap, pod)
        if trouble is not None and trouble.lost:
            actions += _force_step(snap, pod, trouble).actions
            continue
        delete = Delete("Pod", pod.name, uid=pod.uid)
        if not pod.deleting and delete.key not in snap.failed:
            message = f"spec.replicas is {spec.replicas}: deleting the serving pod {pod.name}"
            actions += [delete, Emit(Event("Normal", "ScalingDown", message))]
    consequence = (
        "the serving pod of that name is not created while it exists (an orphan is adopted only with this "
        "PDDeployment's labels and the current spec hash)"
    )
    conflicts = tuple(conflict(view, consequence) for view in held.values())
    return ServingStep(tuple(replicas), len(surplus), tuple(actions), conflicts, frozenset({*live, *held}))


# ---- the goodput probe -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeStep:
    probe: ProbeState
    goodput: GoodputStatus | None = None  # a fresh result
    actions: tuple[Action, ...] = ()


def _job_pods(snap: Snapshot, job: JobView) -> list[PodView]:
    """The Job's own pods (their controller), never another's that carries its job-name label."""
    return [p for p in snap.pods if controlled_by(p.controller, job.uid)]


def _record(spec: PDDeploymentSpec, lay: Layout, job: JobView, pods: Sequence[PodView], step: ProbeStep) -> ProbeStep:
    message = goodput.termination_message(pods)
    try:
        if message is None:
            raise goodput.SummaryError(job.failure)
        result = goodput.goodput_status(goodput.parse_summary(message), spec, lay)
    except goodput.SummaryError as exc:
        error = str(exc)[:ERROR_LIMIT]
        probe = step.probe.model_copy(update={"last_error": error})
        return ProbeStep(probe, step.goodput, (*step.actions, Emit(Event("Warning", "GoodputProbeFailed", error))))
    probe = step.probe.model_copy(update={"last_error": None})
    return ProbeStep(probe, result, (*step.actions, Emit(Event("Normal", "GoodputMeasured", result.summary))))


def _collect(snap: Snapshot, spec: PDDeploymentSpec, lay: Layout, previous: ProbeState) -> tuple[ProbeStep, int]:
    """Record and delete finished probe Jobs; returns the step and how many Jobs still run."""
    step, running = ProbeStep(previous), 0
    for job in probe_jobs(snap):
        if not job.finished and spec.goodput_probe.enabled:
            running += 1
            continue
        pods = _job_pods(snap, job)
        if job.name == step.probe.job_name:
            finished = step.probe.model_copy(update={"job_name": None, "last_finished_at": goodput.rfc3339(snap.now)})
            step = _record(spec, lay, job, pods, ProbeStep(finished, step.goodput, step.actions))
        deletes = (Delete("Job", job.name, uid=job.uid), *(Delete("Pod", p.name, uid=p.uid) for p in pods))
        step = ProbeStep(step.probe, step.goodput, (*step.actions, *deletes))
    return step, running


@dataclass(frozen=True)
class ProbeContext:
    """What decides whether a probe starts now, besides the probe bookkeeping itself."""

    phase: str | None
    has_result: bool
    running_jobs: int
    autotune: bool = False  # an autotuning trial waits for its measurement


def _start(snap: Snapshot, spec: PDDeploymentSpec, lay: Layout, step: ProbeStep, ctx: ProbeContext) -> ProbeStep:
    """Start a probe Job when one is due."""
    annotations = snap.deployment.annotations
    inputs = goodput.ProbeInputs(
        spec=spec,
        phase=ctx.phase,
        probe=step.probe,
        annotations=annotations,
        has_result=ctx.has_result,
        running_jobs=ctx.running_jobs,
        now=snap.now,
        autotune=ctx.autotune,
    )
    trigger = goodput.due(inputs)
    if trigger is None:
        return step
    name = goodput.job_name(snap.deployment.name, snap.now)
    create = Create(render.probe_job(lay, name, snap.probe_image))
    if create.key in snap.failed:
        return step
    update: Obj = {"job_name": name, "trigger": trigger, "started_at": goodput.rfc3339(snap.now)}
    if trigger == "annotation":
        update["last_annotation"] = annotations.get(RUN_PROBE_ANNOTATION)
    started = Emit(Event("Normal", "GoodputProbeStarted", f"probe Job {name} ({trigger})"))
    return ProbeStep(step.probe.model_copy(update=update), step.goodput, (*step.actions, create, started))


# ---- decide ------------------------------------------------------------------------------------------------


def children_refused(stored_status: Mapping[str, Any]) -> bool:
    """Whether the API server refused a child last time: then every tick writes the children again (not
    only every drift-repair interval), so that the condition clears as soon as the cause is fixed."""
    return observe.children_refused(observe.parse(stored_status))


def proxy_urls(snap: Snapshot) -> dict[str, str]:
    """Pod name -> the proxy admin /status to read before deciding: disaggregated replicas whose pod has
    an IP and has not verified a KV transfer yet, and with the canary on all of them (a KV path that
    breaks later is noticed: its canary reports a mismatch)."""
    spec = snap.deployment.valid_spec
    if spec is None:
        return {}
    previous, live, owner = observe.parse(snap.deployment.status), _serving_pods(snap), snap.deployment.owner
    spec = autotune.spec_in_force(spec, previous.autotune)
    scaling = spec.autoscaling.enabled
    if not spec.disaggregated and not scaling:
        return {}
    urls = {}
    for index in range(spec.replicas):
        pod = live.get(render.pod_name(owner, index))
        if pod is None or not pod.ip:
            continue
        check_kv = spec.disaggregated and (
            spec.proxy.canary_interval_seconds > 0
            or not observe.kv_transfer_verified(observe.previous_replica(previous, index), pod)
        )
        if check_kv or (scaling and _proxy_ready(pod)):
            urls[pod.name] = f"http://{pod.ip}:{spec.proxy.admin_port}/status"
    return urls


def _proxy_ready(pod: PodView) -> bool:
    proxy = pod.container(render.PROXY_CONTAINER)
    return not pod.deleting and proxy is not None and proxy.ready


def hpa_read(snap: Snapshot) -> bool:
    """Whether to list the namespace's HorizontalPodAutoscalers: with spec.autoscaling, one owner of replicas."""
    spec = snap.deployment.valid_spec
    return spec is not None and spec.autoscaling.enabled


def router_read(snap: Snapshot) -> str | None:
    """The router Deployment to read before deciding (status.router, RouterReady): with the router enabled."""
    spec = snap.deployment.valid_spec
    return render.router_name(snap.deployment.owner) if spec is not None and spec.router.enabled else None


@dataclass(frozen=True)
class ClaimReads:
    """What to read about DRA before deciding: the deployment's claim templates, the pods' claims."""

    templates: bool = False
    claims: tuple[str, ...] = ()


def prediction_queries(snap: Snapshot) -> tuple[autoscale.Query | None, autoscale.Query | None] | None:
    """spec.autoscaling: the planner's capacity predictions to make before deciding (``autoscale.queries``)."""
    spec = snap.deployment.valid_spec
    if spec is None or not spec.autoscaling.enabled:
        return None
    asked = autoscale.queries(spec, layout.build(snap.deployment.owner, spec), _live_demand(snap))
    return None if asked == (None, None) else asked


def _live_demand(snap: Snapshot) -> DemandStatus | None:
    reports = [r for p in snap.proxies.values() if p.status and (r := autoscale.ProxyDemand.from_status(p.status))]
    return autoscale.demand(reports, snap.now)


def plan_for(snap: Snapshot) -> PDDeploymentSpec | None:
    """The spec whose autotuning trials to plan before deciding (``autotune.plan``), if its workload has none."""
    spec = snap.deployment.valid_spec
    if spec is None:
        return None
    return spec if autotune.plan_due(spec, observe.parse(snap.deployment.status).autotune) else None


def claim_reads(snap: Snapshot) -> ClaimReads:
    """Only a deployment whose GPUs come from DRA reads anything (and needs the RBAC for it)."""
    spec = snap.deployment.valid_spec
    if spec is None or not spec.uses_dra:
        return ClaimReads()
    claims = sorted({c for pod in _serving_pods(snap).values() if (c := pod.claims.get(render.DRA_CLAIM))})
    return ClaimReads(templates=True, claims=tuple(claims))


def _unused_claim_templates(snap: Snapshot, current: str | None) -> list[Action]:
    """Replaced claim templates of its own that no pod refers to any more: delete them, each with its uid as a
    precondition (their claims live on)."""
    used = {t for pod in snap.pods for t in pod.claim_templates}
    return [
        Delete("ResourceClaimTemplate", t.name, uid=t.uid)
        for t in snap.claim_templates
        if t.name != current and t.name not in used and controlled_by(t.controller, snap.deployment.uid)
    ]


@dataclass(frozen=True)
class InForce:
    """The spec the serving pod runs (autotune's layout ``name`` in force, else the spec's own) and its layout."""

    name: str | None
    spec: PDDeploymentSpec
    layout: Layout


def _in_force(d: Deployment, spec: PDDeploymentSpec, tuning: autotune.Step, known: InForce | None = None) -> InForce:
    """Built once per layout in force: ``known`` again unless a trial's result put another layout in force."""
    name = tuning.state.layout_in_force if tuning.state is not None else None
    if known is not None and known.name == name:
        return known
    in_force = autotune.spec_in_force(spec, tuning.state)
    return InForce(name, in_force, layout.build(d.owner, in_force))


def _decision(previous: Mapping[str, Any], status: PDDeploymentStatus, actions: Sequence[Action]) -> Decision:
    return Decision(status, observe.merge_patch(previous, observe.wire(status)), tuple(actions))


Target = tuple[str, str]  # (kind, name) of an object the shell reads for the core


def _router_lookup(spec: PDDeploymentSpec, owner: layout.Owner) -> Target | None:
    """The router Deployment when the router is off (the rest goes with it), its PodDisruptionBudget with one pod."""
    name = render.router_name(owner)
    if not spec.router.enabled:
        return ("Deployment", name)
    return ("PodDisruptionBudget", name) if spec.router.replicas == 1 else None


def _router_takes(spec: PDDeploymentSpec, owner: layout.Owner) -> list[Target]:
    kinds = render.ROUTER_KINDS if not spec.router.enabled else ("PodDisruptionBudget",)
    return [(kind, render.router_name(owner)) for kind in kinds]


def _pool_lookup(spec: PDDeploymentSpec, owner: layout.Owner) -> Target | None:
    return None if spec.inference_pool.enabled else ("InferencePool", render.inference_pool_name(owner))


def _pool_takes(spec: PDDeploymentSpec, owner: layout.Owner) -> list[Target]:
    return [("InferencePool", render.inference_pool_name(owner))]


@dataclass(frozen=True)
class Leftover:
    """Children an earlier spec rendered and this one does not: on repairs the shell reads the one object
    ``lookup`` names (a read per reconcile, not a delete per tick); once that object is seen to be this
    PDDeployment's (an owner reference with its uid), the shell reads what it ``takes`` along, and each of
    those that is this PDDeployment's too is deleted with its uid as precondition, the lookup object
    last, so the lookup finds something until all are gone. What another owner holds is never deleted."""

    lookup: Callable[[PDDeploymentSpec, layout.Owner], Target | None]
    takes: Callable[[PDDeploymentSpec, layout.Owner], list[Target]]


LEFTOVERS = {
    "router": Leftover(_router_lookup, _router_takes),
    "inferencePool": Leftover(_pool_lookup, _pool_takes),
}


def _key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def owner_read(snap: Snapshot) -> bool:
    """Whether to read this PDDeployment again (a GET, served from etcd) before deciding: only when an orphan
    is there that the adoption rule admits. Kubernetes' controllers re-check the owner so before adopting:
    one being deleted (an orphaning delete removes its children's owner references first) or replaced by
    another of the same name adopts nothing."""
    spec, d = snap.deployment.valid_spec, snap.deployment
    seen = {key: view for key, view in snap.seen.items() if view is not None and adoptable(view, d)}
    orphans = any(p.controller is None and _is_serving(p) for p in snap.pods)
    if spec is None or not (seen or orphans):
        return False
    children = render.children(_now(snap, spec).in_force.layout, snap.operator_namespace)
    applied = {_key(o["kind"], o["metadata"]["name"]) for o in children.applied}
    return bool(_orphans(snap, children.pods)) or bool(applied & seen.keys())


def _found_leftovers(snap: Snapshot, spec: PDDeploymentSpec, owner: layout.Owner) -> list[Leftover]:
    """The leftovers whose lookup object was read and is this PDDeployment's."""
    found = []
    for left in LEFTOVERS.values():
        target = left.lookup(spec, owner)
        if target is not None and owned(snap.seen.get(_key(*target)), snap.deployment):
            found.append(left)
    return found


def _leftover_deletes(snap: Snapshot, spec: PDDeploymentSpec, owner: layout.Owner) -> list[Action]:
    deletes: list[Action] = []
    for left in _found_leftovers(snap, spec, owner):
        for kind, name in left.takes(spec, owner):
            view = snap.seen.get(_key(kind, name))
            if view is not None and owned(view, snap.deployment):
                deletes.append(Delete(kind, name, uid=view.uid))
    return deletes


def applied_children(snap: Snapshot) -> list[Target]:
    """The children :func:`decide` will apply, on repairs of a valid spec (the layout built once for them)."""
    spec = snap.deployment.valid_spec
    if not snap.repair_children or spec is None:
        return []
    return [
        (o["kind"], o["metadata"]["name"])
        for o in render.children(_now(snap, spec).in_force.layout, snap.operator_namespace).applied
    ]


def object_reads(snap: Snapshot, children: Sequence[Target]) -> list[Target]:
    """What the shell reads (GET, at once) before deciding, on repairs of a valid spec, that it has not read
    yet this reconcile: every applied child (``children``, from :func:`applied_children`) not known to be
    this PDDeployment's (``snap.known``), each leftover lookup, and what a leftover seen to be ours takes
    along. The shell reads until this is empty (two rounds at most: the second only while a leftover of
    ours is there to delete)."""
    spec = snap.deployment.valid_spec
    if not snap.repair_children or spec is None:
        return []
    owner = snap.deployment.owner
    wanted = [t for t in children if _key(*t) not in snap.known]
    wanted += [t for left in LEFTOVERS.values() if (t := left.lookup(spec, owner)) is not None]
    wanted += [t for left in _found_leftovers(snap, spec, owner) for t in left.takes(spec, owner)]
    return list(dict.fromkeys(t for t in wanted if _key(*t) not in snap.seen and _key(*t) not in snap.unread))


# What a child held by another owner costs; a child not named here costs only itself.
_BLOCKS_THE_POD = {
    "ConfigMap": "its proxy would read the settings of that ConfigMap",
    "ResourceClaimTemplate": "its GPUs would be claimed through that template",
}


@dataclass(frozen=True)
class ChildrenStep:
    """The applies of the children this PDDeployment may write, and the conflicts over the others."""

    applies: tuple[Action, ...] = ()
    conflicts: tuple[Refusal, ...] = ()
    blocked: str | None = None  # why the serving pod is not created
    complete: bool = True  # every child was applied or found held (none left out for a failed read)


def _apply_children(snap: Snapshot, applied: Sequence[Obj]) -> ChildrenStep:
    """Server-side apply of every rendered child that is absent or this PDDeployment's (with its uid as a
    precondition: a replaced object fails the apply instead of being taken over). A child of a rendered name
    that another owner holds is left alone, and the whole router with one of its objects."""
    d = snap.deployment
    held: dict[str, ObjectView] = {}
    confirmed = owner_confirmed(snap)
    for obj in applied:
        view = snap.seen.get(_key(obj["kind"], obj["metadata"]["name"]))
        if view is not None and not owned(view, d) and not (confirmed and adoptable(view, d)):
            held[view.key] = view
    router_held = any(_is_router(obj) and _key(obj["kind"], obj["metadata"]["name"]) in held for obj in applied)
    applies: list[Action] = []
    conflicts: list[Refusal] = []
    blocked: list[str] = []
    complete = True
    for obj in applied:
        kind, key = obj["kind"], _key(obj["kind"], obj["metadata"]["name"])
        if key in held:
            why = _BLOCKS_THE_POD.get(kind)
            router = "the router is not applied" if _is_router(obj) else None
            consequence = router or (
                f"the serving pod is not created: {why}" if why else f"serving goes on without its {kind}"
            )
            conflicts.append(conflict(held[key], consequence))
            if why and not _is_router(obj):
                blocked.append(f"{key} belongs to another owner and {why}")
            continue
        if router_held and _is_router(obj):
            continue
        view = snap.seen.get(key)
        uid = view.uid if view is not None else snap.known.get(key)
        if key in snap.unread and uid is None:
            complete = False  # who holds it is not known: read again on the next repair
            continue
        applies.append(Apply(_with_uid(obj, uid) if uid else obj))
    return ChildrenStep(tuple(applies), tuple(conflicts), "; ".join(blocked) or None, complete)


def _is_router(obj: Obj) -> bool:
    return bool(obj["metadata"].get("labels", {}).get(render.LABEL_COMPONENT) == render.COMPONENT_ROUTER)


def _with_uid(obj: Obj, uid: str) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "uid": uid}}


@dataclass(frozen=True)
class Now:
    """This reconcile's autotune step, probe Jobs collected, and the spec and layout in force after them."""

    tuning: autotune.Step
    collected: ProbeStep
    running: int
    in_force: InForce


def _now(snap: Snapshot, spec: PDDeploymentSpec) -> Now:
    previous = observe.parse(snap.deployment.status)
    tuning = autotune.begin(spec, previous.autotune, snap.plan)
    measured = _in_force(snap.deployment, spec, tuning)  # what a probe finishing now has measured
    collected, running = _collect(snap, measured.spec, measured.layout, previous.probe)
    tuning = _trial_result(tuning, previous.probe, collected, goodput.rfc3339(snap.now), spec)
    return Now(tuning, collected, running, _in_force(snap.deployment, spec, tuning, measured))


def decide(snap: Snapshot) -> Decision:
    """The desired status of one PDDeployment and the actions that get the cluster there."""
    d = snap.deployment
    previous = observe.parse(d.status)
    now = goodput.rfc3339(snap.now)
    spec = d.checked
    if isinstance(spec, SpecError):
        obs = Observation(
            generation=d.generation,
            now=now,
            spec=None,
            spec_problems=spec.problems,
            spec_reason=spec.reason,
            previous=previous,
        )
        new = observe.status(obs)
        return _decision(d.status, new, [Emit(e) for e in observe.events(previous, new)])
    step = _now(snap, spec)
    tuning, collected, running, in_force = step.tuning, step.collected, step.running, step.in_force
    spec, lay = in_force.spec, in_force.layout
    children = render.children(lay, snap.operator_namespace)
    written = _apply_children(snap, children.applied) if snap.repair_children else ChildrenStep()
    secret = CreateSecret(children.credentials, render.CREDENTIAL_KEYS)
    repairs = [secret, *written.applies] if snap.repair_children else []
    template = render.claim_template_name(lay) if lay.dra_device_class is not None else None
    repairs += _unused_claim_templates(snap, template)
    repairs += _leftover_deletes(snap, spec, lay.owner)
    serving = _serving_step(snap, spec, lay, children.pods, previous, written.blocked)
    unowned = left_alone(snap, serving.claimed, template)
    obs = Observation(
        generation=d.generation,
        now=now,
        spec=spec,
        layout=lay,
        replicas=serving.replicas,
        surplus=serving.surplus,
        previous=previous,
        goodput=collected.goodput,
        refusals=(
            *written.conflicts,
            *serving.conflicts,
            *unowned,
            *(refused(key, failure) for key, failure in snap.failed.items()),
        ),
        children_written=snap.repair_children and written.complete,
        autotune=tuning.state,
        claims=snap.claims,
        router=snap.router,
    )
    observed = observe.status(obs)
    ctx = ProbeContext(observed.phase, observed.goodput is not None, running, autotune.probe_due(tuning.state))
    probe = _start(snap, spec, lay, collected, ctx)
    update: Obj = {"probe": probe.probe}
    started = probe.probe.job_name != collected.probe.job_name
    if tuning.state is not None and started and probe.probe.trigger == "autotune":
        update["autotune"] = tuning.state.model_copy(update={"probing": tuning.state.layout_in_force})
    scaling = _autoscaling(snap, spec, observed, previous)
    scaled = observed.model_copy(update={**update, **scaling.status})
    new = observe.with_condition(scaled, scaling.condition, previous, now, d.generation)
    events = [Emit(e) for e in (*tuning.events, *scaling.events, *observe.events(previous, new))]
    return _decision(d.status, new, [*repairs, *serving.actions, *probe.actions, *scaling.actions, *events])


@dataclass(frozen=True)
class ScalingStep:
    status: Obj  # status.capacity, .demand and .autoscaling
    condition: Condition | None  # ScalingActive
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()


def _autoscaling(
    snap: Snapshot, spec: PDDeploymentSpec, observed: PDDeploymentStatus, previous: PDDeploymentStatus
) -> ScalingStep:
    """spec.autoscaling: demand from the replicas' proxies, capacity from the goodput search or the planner
    (an Event when its basis changes), the decision."""
    if not spec.autoscaling.enabled:
        return ScalingStep({"capacity": None, "demand": None, "autoscaling": None}, None)
    live = _live_demand(snap)
    predicted = snap.predictions or autoscale.Predictions(None, None)
    per_replica = autoscale.capacity(spec.autoscaling, spec.goodput_probe, observed.goodput, live, predicted, snap.now)
    noted = autoscale.capacity_event(previous.capacity, per_replica)
    basis = () if noted is None else (Event("Normal", *noted),)
    hpa = None if snap.hpas is None else next(iter(snap.hpas), None)
    replicas = autoscale.Replicas(spec=spec.replicas, available=observed.available_replicas, hpa=hpa)
    before = previous.autoscaling
    verdict = autoscale.decide(
        spec.autoscaling, replicas, live, per_replica, before.recommendations if before else (), snap.now
    )
    action = None if verdict.replicas is None else Scale(snap.deployment.name, verdict.replicas)
    failure = None if action is None else snap.failed.get(action.key)
    cond = observe.condition(SCALING_ACTIVE, verdict.status == "True", verdict.reason, verdict.message)
    if failure is not None:
        cond = observe.condition(SCALING_ACTIVE, False, "ScaleFailed", f"cannot set replicas: {failure}")
    state = AutoscalingStatus(
        desired_replicas=verdict.desired(spec.replicas),
        recommendations=list(verdict.recommendations),
        last_scale_time=goodput.rfc3339(snap.now) if action and not failure else (before and before.last_scale_time),
        message=cond.message,
    )
    status = {"capacity": per_replica, "demand": live, "autoscaling": state}
    if action is None or failure is not None:
        return ScalingStep(status, cond, (), basis)
    scaled = Event("Normal", verdict.reason, verdict.event or verdict.message)
    return ScalingStep(status, cond, (action,), (*basis, scaled))


def _trial_result(
    tuning: autotune.Step, before: ProbeState, collected: ProbeStep, now: str, spec: PDDeploymentSpec
) -> autotune.Step:
    """The probe Job of an autotuning trial finished: record its result (or its failure) in the trial."""
    state = tuning.state
    if state is None or state.probing is None or before.job_name is None or collected.probe.job_name is not None:
        return tuning
    step = autotune.record(state, collected.goodput, collected.probe.last_error, now, spec.goodput_probe.slo.target)
    return autotune.Step(step.state, (*tuning.events, *step.events))
