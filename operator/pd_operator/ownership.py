"""Pure: whose object is whose. By uid, as Kubernetes' controllers own: this PDDeployment keeps, rolls, reads
or deletes only what names its uid (its controller reference, or an owner reference for applied children),
takes over an orphan only by the adoption rule once it is read again and confirmed, and leaves alone, and
says so (``NotOwned``, ``NameConflict``), what another owner holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from pd_operator import render
from pd_operator.conditions import NAME_CONFLICT, NOT_OWNED
from pd_operator.refusals import Refusal
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.views import JobView, ObjectView, OwnerRef, PodView


def controlled_by(ref: OwnerRef | None, uid: str | None) -> bool:
    """Whether the object's controller reference names ``uid``. By uid, as Kubernetes' controllers own: a
    PDDeployment created again under the same name controls nothing of the first one's, and labels alone make
    nothing anyone's."""
    return ref is not None and bool(uid) and ref.uid == uid


def owned(view: ObjectView | None, d: Deployment) -> bool:
    """Whether an owner reference of the object names this PDDeployment's uid."""
    return view is not None and any(ref.uid == d.uid for ref in view.owners)


def adoptable(view: ObjectView, d: Deployment) -> bool:
    """No owner at all, and labelled as this PDDeployment's by pd-operator: what ``pdctl render | kubectl
    apply`` made (render without a uid writes no owner reference). Once this PDDeployment, read again, is
    confirmed (:func:`decide.owner_read`), the operator applies it as its own."""
    return not view.owners and labelled(view.labels, d)


def labelled(labels: Mapping[str, str], d: Deployment) -> bool:
    """Labelled as this PDDeployment's by pd-operator."""
    return labels.get(render.LABEL_MANAGED_BY) == render.MANAGER and labels.get(render.LABEL_DEPLOYMENT) == d.name


def owner_confirmed(snap: Snapshot) -> bool:
    """This PDDeployment, read again before adopting, is the same one (its uid) and is not being deleted."""
    again = snap.reread
    return again is not None and again.uid == snap.deployment.uid and not again.deleting


def probe_jobs(snap: Snapshot) -> list[JobView]:
    """The probe Jobs this PDDeployment controls: the only ones it reads a result from and deletes."""
    return [j for j in snap.jobs if controlled_by(j.controller, snap.deployment.uid)]


def as_object(kind: str, view: PodView | JobView) -> ObjectView:
    """A pod or Job as the object a refusal names, its controller its one owner."""
    return ObjectView(kind, view.name, view.uid or "", (view.controller,) if view.controller else (), view.labels)


def _holders(view: ObjectView) -> str:
    return ", ".join(f"{ref} (uid {ref.uid})" for ref in view.owners) or "no owner reference"


def holder(view: ObjectView) -> str:
    return f"{view.key} (uid {view.uid}) belongs to {_holders(view)}"


def conflict(view: ObjectView, consequence: str) -> Refusal:
    fields = (f"{view.key} (uid {view.uid}) exists and belongs to {_holders(view)}", consequence)
    return Refusal(view.key, NAME_CONFLICT, "a name conflict", fields, f"{view.key} held by {_holders(view)}")


def not_owned(view: ObjectView, consequence: str) -> Refusal:
    fields = (f"{view.key} (uid {view.uid}) carries this PDDeployment's labels and belongs to {_holders(view)}",)
    return Refusal(view.key, NOT_OWNED, "the ownership rule", (*fields, consequence), holder(view))


def left_alone(snap: Snapshot, claimed: frozenset[str], template: str | None) -> tuple[Refusal, ...]:
    """The pods, Jobs and claim templates with this PDDeployment's labels that another controller holds, or
    none the adoption rule admits, and not already reported: left alone, and said so. A pod of its own probe
    Job's is its own; one being deleted is going anyway."""
    uid, jobs = snap.deployment.uid, probe_jobs(snap)
    pods = [
        not_owned(as_object("Pod", p), "left alone: not a replica of it, never rolled or deleted by it")
        for p in snap.pods
        if p.name not in claimed and not p.deleting and not any(controlled_by(p.controller, j.uid) for j in jobs)
    ]
    others = [
        not_owned(as_object("Job", j), "left alone: never read as a probe or deleted")
        for j in snap.jobs
        if not controlled_by(j.controller, uid)
    ]
    templates = [
        not_owned(t, "left alone: never deleted")
        for t in snap.claim_templates
        if t.name != template and not controlled_by(t.controller, uid)
    ]
    return (*pods, *others, *templates)
