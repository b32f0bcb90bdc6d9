"""Pure: one reconciliation, decided at once. A snapshot of the world in; the status and the actions out.

The handlers gather a :class:`Snapshot` (the PDDeployment, its pods and probe Jobs from kopf's indexes,
the proxy's report, autotune's plan, the time), call :func:`decide`, execute the :data:`Action` list in order and write
the status patch. When an action fails they decide once more with the failures in the snapshot, so
that what the user sees (a status message, no "created" Event) follows from the same pure function.
Here: what the shell reads before deciding, the other children's step (apply, what another owner holds,
leftovers), the autoscaling and autotune steps, and :func:`decide`, which puts them together with the
serving pods' step (serving_pods.py) and the probe Jobs' (probe_jobs.py) over one ownership rule (ownership.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pd_operator import autoscale, autotune, goodput, layout, observe, render
from pd_operator.actions import Action, Apply, CreateSecret, Decision, Delete, Emit, Scale, refused
from pd_operator.api import (
    AutoscalingStatus,
    Condition,
    DemandStatus,
    PDDeploymentSpec,
    PDDeploymentStatus,
    ProbeState,
)
from pd_operator.command_lines import engine_containers
from pd_operator.conditions import SCALING_ACTIVE
from pd_operator.layout import Layout
from pd_operator.observe import Event, Observation
from pd_operator.ownership import (
    adoptable,
    conflict,
    controlled_by,
    left_alone,
    owned,
    owner_confirmed,
)
from pd_operator.probe_jobs import ProbeContext, ProbeStep, collect_probes, start_probe
from pd_operator.refusals import Refusal
from pd_operator.serving_pods import controlled_pods, is_serving, orphans, serving_step
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError
from pd_operator.views import ObjectView, PodView

Obj = dict[str, Any]
Target = tuple[str, str]  # (kind, name) of an object the shell reads for the core


# ---- the reads the shell is asked to make, before deciding -------------------------------------------------


def children_refused(stored_status: Mapping[str, Any]) -> bool:
    """Whether the API server refused a child last time: then every tick writes the children again (not
    only every drift-repair interval), so that the condition clears as soon as the cause is fixed."""
    return observe.children_refused(observe.parse(stored_status))


def proxy_urls(snap: Snapshot) -> dict[str, str]:
    """Pod name -> the proxy admin /status to read before deciding: disaggregated replicas whose pod has
    an IP and has not verified a KV transfer yet, and with the canary on all of them (a KV path that
    breaks later is noticed: its canary reports a mismatch); any replica whose engines' vLLM releases are
    not all known yet, once its proxy is ready; and, once ready, every replica with autoscaling or whose
    engines export vLLM's transfer counters (status.replicaStatuses[].engineTransfer)."""
    spec = snap.deployment.valid_spec
    if spec is None:
        return {}
    previous, live, owner = observe.parse(snap.deployment.status), controlled_pods(snap), snap.deployment.owner
    spec = autotune.spec_in_force(spec, previous.autotune)
    scaling = spec.autoscaling.enabled
    engines = len(engine_containers(spec))
    urls = {}
    for index in range(spec.replicas):
        pod = live.get(render.pod_name(owner, index))
        if pod is None or not pod.ip:
            continue
        prior = observe.previous_replica(previous, index)
        check_kv = spec.disaggregated and (
            spec.proxy.canary_interval_seconds > 0 or not observe.kv_transfer_verified(prior, pod)
        )
        versions_unknown = not observe.engine_versions_known(engines, prior, pod) and _proxy_ready(pod)
        follow = (scaling or observe.engine_transfer_shown(prior, pod)) and _proxy_ready(pod)
        if check_kv or versions_unknown or follow:
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


def claim_reads(snap: Snapshot) -> ClaimReads:
    """Only a deployment whose GPUs come from DRA reads anything (and needs the RBAC for it)."""
    spec = snap.deployment.valid_spec
    if spec is None or not spec.uses_dra:
        return ClaimReads()
    claims = sorted({c for pod in controlled_pods(snap).values() if (c := pod.claims.get(render.DRA_CLAIM))})
    return ClaimReads(templates=True, claims=tuple(claims))


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


def owner_read(snap: Snapshot) -> bool:
    """Whether to read this PDDeployment again (a GET, served from etcd) before deciding: only when an orphan
    is there that the adoption rule admits. Kubernetes' controllers re-check the owner so before adopting:
    one being deleted (an orphaning delete removes its children's owner references first) or replaced by
    another of the same name adopts nothing."""
    spec, d = snap.deployment.valid_spec, snap.deployment
    seen = {key: view for key, view in snap.seen.items() if view is not None and adoptable(view, d)}
    ownerless = any(p.controller is None and is_serving(p) for p in snap.pods)
    if spec is None or not (seen or ownerless):
        return False
    children = render.children(_now(snap, spec).in_force.layout, snap.operator_namespace)
    applied = {_key(o["kind"], o["metadata"]["name"]) for o in children.applied}
    return bool(orphans(snap, children.pods)) or bool(applied & seen.keys())


def applied_children(snap: Snapshot) -> list[Target]:
    """The children :func:`decide` will apply, and the credentials Secret it creates when absent, on repairs
    of a valid spec (the layout built once for them): who holds each is read before deciding."""
    spec = snap.deployment.valid_spec
    if not snap.repair_children or spec is None:
        return []
    children = render.children(_now(snap, spec).in_force.layout, snap.operator_namespace)
    return [(o["kind"], o["metadata"]["name"]) for o in (children.credentials, *children.applied)]


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


# ---- the children ------------------------------------------------------------------------------------------


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


def _credentials(snap: Snapshot, secret: Obj) -> ChildrenStep:
    """Create the credentials Secret when it was not seen (a 409 leaves one there as it is); one seen to be
    ours is left alone, with no write on each drift repair. One of its name that another owner holds is left
    alone and keeps the serving pod from being created: its engines and proxy would take their keys from a
    Secret whose keys someone else chose."""
    view = snap.seen.get(_key(secret["kind"], secret["metadata"]["name"]))
    if view is not None and owned(view, snap.deployment):
        return ChildrenStep()
    if view is not None:
        why = "its engines and proxy would take their keys from a Secret another owner chose"
        return ChildrenStep(
            conflicts=(conflict(view, f"the serving pod is not created: {why}"),),
            blocked=f"{view.key} belongs to another owner and {why}",
        )
    return ChildrenStep(applies=(CreateSecret(secret, render.CREDENTIAL_KEYS),))


def _is_router(obj: Obj) -> bool:
    return bool(obj["metadata"].get("labels", {}).get(render.LABEL_COMPONENT) == render.COMPONENT_ROUTER)


def _with_uid(obj: Obj, uid: str) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "uid": uid}}


def _key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def _unused_claim_templates(snap: Snapshot, current: str | None) -> list[Action]:
    """Replaced claim templates of its own that no pod refers to any more: delete them, each with its uid as a
    precondition (their claims live on)."""
    used = {t for pod in snap.pods for t in pod.claim_templates}
    return [
        Delete("ResourceClaimTemplate", t.name, uid=t.uid)
        for t in snap.claim_templates
        if t.name != current and t.name not in used and controlled_by(t.controller, snap.deployment.uid)
    ]


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


# ---- decide ------------------------------------------------------------------------------------------------


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
    collected, running = collect_probes(snap, measured.spec, measured.layout, previous.probe)
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
    written, keys = ChildrenStep(), ChildrenStep()
    if snap.repair_children:
        written, keys = _apply_children(snap, children.applied), _credentials(snap, children.credentials)
    repairs = [*keys.applies, *written.applies]
    template = render.claim_template_name(lay) if lay.dra_device_class is not None else None
    repairs += _unused_claim_templates(snap, template)
    repairs += _leftover_deletes(snap, spec, lay.owner)
    blocked = "; ".join(b for b in (keys.blocked, written.blocked) if b) or None
    serving = serving_step(snap, spec, lay, children.pods, previous, blocked)
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
            *keys.conflicts,
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
    probe = start_probe(snap, spec, lay, collected, ctx)
    update: Obj = {"probe": probe.probe}
    started = probe.probe.job_name != collected.probe.job_name
    if tuning.state is not None and started and probe.probe.trigger == "autotune":
        update["autotune"] = tuning.state.model_copy(update={"probing": tuning.state.layout_in_force})
    scaling = _autoscaling(snap, spec, observed, previous)
    scaled = observed.model_copy(update={**update, **scaling.status})
    new = observe.with_condition(scaled, scaling.condition, previous, now, d.generation)
    events = [Emit(e) for e in (*tuning.events, *scaling.events, *observe.events(previous, new))]
    return _decision(d.status, new, [*repairs, *serving.actions, *probe.actions, *scaling.actions, *events])


def _decision(previous: Mapping[str, Any], status: PDDeploymentStatus, actions: Sequence[Action]) -> Decision:
    return Decision(status, observe.merge_patch(previous, observe.wire(status)), tuple(actions))


# ---- autoscaling and autotune ------------------------------------------------------------------------------


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
