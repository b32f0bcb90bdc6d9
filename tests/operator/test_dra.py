"""DRA in the core (pure): what is read, which claim templates go, and the allocation read back."""

from __future__ import annotations

import dataclasses
from typing import Any

from pd_operator import api, decide, layout, render
from pd_operator.actions import Delete
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import validate_spec
from pd_operator.views import ObjectView, OwnerRef, claim_view, pod_view
from tests.operator.conftest import DRA
from tests.operator.podfacts import running_pod
from tests.operator.test_decide import NAME, NS, OWNER, T0, UID, cond, stored

SPEC: dict[str, Any] = {"model": "m", "engine": "simulated", "simulation": {"reserveGpus": True}, "gpuAllocation": DRA}
CLAIM = "demo-gpus-x7k2p"


def _pod(spec: dict[str, Any] = SPEC) -> dict[str, Any]:
    pod = running_pod(render.children(layout.build(OWNER, validate_spec(spec))).pods[0])
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": CLAIM}]
    return pod


def _claim(devices: list[tuple[str, str]]) -> dict[str, Any]:
    results = [{"request": r, "driver": "gpu.amd.com", "pool": "mi300x-0", "device": d} for r, d in devices]
    return {"metadata": {"name": CLAIM}, "status": {"allocation": {"devices": {"results": results}}}}


def _snap(pods: list[dict[str, Any]], **kw: Any) -> Snapshot:
    return Snapshot(Deployment(NAME, NS, UID, 1, SPEC, {}), T0, pods=[pod_view(p) for p in pods], **kw)


def _template(spec: dict[str, Any] = SPEC) -> str:
    return render.claim_template_name(layout.build(OWNER, validate_spec(spec)))


def test_only_a_dra_deployment_reads_its_templates_and_claims() -> None:
    assert decide.claim_reads(_snap([_pod()])) == decide.ClaimReads(templates=True, claims=(CLAIM,))
    plugin = Snapshot(Deployment(NAME, NS, UID, 1, {"model": "m", "engine": "simulated"}, {}), T0)
    assert decide.claim_reads(plugin) == decide.ClaimReads()


def _listed(name: str, owner_uid: str = UID) -> ObjectView:
    """A ResourceClaimTemplate as the shell lists it, its controller the PDDeployment of ``owner_uid``."""
    return ObjectView("ResourceClaimTemplate", name, f"uid-{name}", (OwnerRef(api.KIND, NAME, owner_uid, True),))


def test_a_replaced_template_is_deleted_once_no_pod_refers_to_it() -> None:
    old = _template()
    moved = {**SPEC, "prefill": {"gpus": "4-7"}, "decode": {"gpus": "0-3"}}
    new = _template(moved)
    assert new != old
    listed = [_listed(old), _listed(new)]
    still_used = _snap([_pod()], claim_templates=listed, repair_children=False)
    deployment = Deployment(NAME, NS, UID, 2, moved, {})
    deletes = [a for a in decide.decide(_with(still_used, deployment)).actions if isinstance(a, Delete)]
    assert [d for d in deletes if d.name == old] == []  # the running pod still refers to it
    unused = _with(_snap([_pod(moved)], claim_templates=listed, repair_children=False), deployment)
    deletes = [a for a in decide.decide(unused).actions if isinstance(a, Delete)]
    assert deletes == [Delete("ResourceClaimTemplate", old, uid=f"uid-{old}")]


def test_a_template_of_another_controller_is_never_deleted_and_said_so() -> None:
    """Labelled as this PDDeployment's and unused, but controlled by another owner (or by an earlier
    PDDeployment of the same name): left alone, ChildrenAdmitted False with reason NotOwned, and an Event."""
    moved = {**SPEC, "prefill": {"gpus": "4-7"}, "decode": {"gpus": "0-3"}}
    theirs = [_listed(_template(), "uid-earlier"), _listed("demo-gpus-theirs", "uid-earlier")]
    snap = _snap([_pod(moved)], claim_templates=theirs, repair_children=False)
    decision = decide.decide(_with(snap, Deployment(NAME, NS, UID, 2, moved, {})))
    assert [a for a in decision.actions if isinstance(a, Delete)] == []
    admitted = cond(stored({}, decision), "ChildrenAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "NotOwned")
    assert (
        f"ResourceClaimTemplate/demo-gpus-theirs (uid uid-demo-gpus-theirs) carries this PDDeployment's labels "
        f"and belongs to PDDeployment/{NAME} (uid uid-earlier)" in admitted["message"]
    )
    assert [e.type for e in decision.events if e.reason == "NotOwned"] == ["Warning"]


def _with(snap: Snapshot, deployment: Deployment) -> Snapshot:
    return dataclasses.replace(snap, deployment=deployment)


def test_the_assignment_is_what_the_claim_was_allocated() -> None:
    pending = decide.decide(_snap([_pod()])).status.gpu_assignment
    assert pending is not None and pending.claim == CLAIM and pending.prefill == "-"
    assert pending.note == f"ResourceClaim {CLAIM} is not allocated yet"
    devices = [("prefill", f"gpu-{i + 1}-{128 + i}") for i in range(4)] + [("decode", "gpu-5-132")]
    claims = {CLAIM: claim_view(_claim(devices))}
    done = decide.decide(_snap([_pod()], claims=claims)).status.gpu_assignment
    assert done is not None
    assert done.prefill == "gpu-1-128,gpu-2-129,gpu-3-130,gpu-4-131" and done.decode == "gpu-5-132"
    assert [(d.request, d.device, d.pool) for d in done.allocated][-1] == ("decode", "gpu-5-132", "mi300x-0")
    assert done.note.startswith(f"allocated by ResourceClaim {CLAIM} (pool mi300x-0)")
