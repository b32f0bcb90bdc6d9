"""Pure: the serving pods' step of one reconcile. One pod per replica: created, kept, rolled when the spec
changed (at most ``rollout.maxUnavailable`` replicas out of service at a time), replaced when it ended,
force-deleted when its node is lost past the grace, deleted beyond ``spec.replicas``; an orphan the adoption
rule admits is adopted, a pod of another owner that holds a replica's name is a name conflict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pd_operator import goodput, observe, render
from pd_operator.actions import Action, Adopt, Create, Delete, Emit, refused
from pd_operator.api import PDDeploymentSpec, PDDeploymentStatus
from pd_operator.layout import Layout
from pd_operator.observe import Event, NodeTrouble, ReplicaObservation
from pd_operator.ownership import as_object, conflict, controlled_by, holder, labelled, owner_confirmed
from pd_operator.refusals import Refusal
from pd_operator.snapshot import Snapshot
from pd_operator.views import PodView, pod_view

Obj = dict[str, Any]

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


def is_serving(pod: PodView) -> bool:
    return pod.labels.get(render.LABEL_COMPONENT) == render.COMPONENT_SERVING


def controlled_pods(snap: Snapshot) -> dict[str, PodView]:
    """The serving pods this PDDeployment controls, by name: the only ones it keeps, rolls or deletes."""
    return {p.name: p for p in snap.pods if is_serving(p) and controlled_by(p.controller, snap.deployment.uid)}


def orphans(snap: Snapshot, desired: Sequence[Obj]) -> dict[str, PodView]:
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
        and is_serving(p)
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
    return {n: p for n, p in orphans(snap, desired).items() if _adopt(snap, p).key not in snap.failed}


@dataclass(frozen=True)
class ServingStep:
    replicas: tuple[ReplicaObservation, ...]
    surplus: int  # serving pods beyond spec.replicas, deleted (scale-down) or terminating
    actions: tuple[Action, ...]
    conflicts: tuple[Refusal, ...] = ()  # pods of another owner that hold a replica's name
    claimed: frozenset[str] = frozenset()  # the pods it controls, adopts or reports a name conflict with


def serving_step(
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
    live = {**controlled_pods(snap), **adopted}
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
