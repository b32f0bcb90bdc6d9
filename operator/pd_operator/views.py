"""Pure: the few facts the operator reads from pods, Jobs, Nodes, ResourceClaims and the router Deployment, as
small typed views built once, at the edge; with each pod's and Job's controller reference, as the operator
acts only on what it controls.

kopf's indexes store these views instead of whole objects, so the core never digs through nested
dicts and the operator's memory grows with what it uses, not with what the kubelet writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pd_operator.api import AllocatedDevice

MESSAGE_LIMIT = 1024
ContainerState = Literal["waiting", "running", "terminated", "unknown"]
ENDED_PHASES = ("Failed", "Succeeded")
NO_SUMMARY = "the probe Job ended without a summary"
# The taints the node lifecycle controller puts on a node whose Ready condition is False or Unknown.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NODE_LOSS_TAINTS = (NOT_READY_TAINT, UNREACHABLE_TAINT)


@dataclass(frozen=True)
class OwnerRef:
    """One owner reference; ``controller``: the one owner that may act on the object (at most one has it)."""

    kind: str
    name: str
    uid: str
    controller: bool = False

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def owner_refs(meta: Mapping[str, Any]) -> tuple[OwnerRef, ...]:
    return tuple(
        OwnerRef(str(r.get("kind", "")), str(r.get("name", "")), str(r.get("uid", "")), r.get("controller") is True)
        for r in meta.get("ownerReferences") or []
    )


def controller_ref(meta: Mapping[str, Any]) -> OwnerRef | None:
    """The controller reference: who acts on the object (Kubernetes' controllers act only on their own)."""
    return next((ref for ref in owner_refs(meta) if ref.controller), None)


@dataclass(frozen=True)
class ContainerView:
    """One containerStatus: readiness, restarts, and the state with its reason and last message."""

    name: str
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    state: ContainerState = "unknown"
    reason: str = ""
    message: str = ""  # the state's message, else the last termination's (truncated)
    terminated_message: str | None = None  # the full termination message of the current state, if terminated
    exit_code: int | None = None  # of the latest run that ended (the current state, else the last termination)
    ended_message: str = ""  # that run's full termination message


@dataclass(frozen=True)
class PodView:
    """A serving or probe pod."""

    name: str
    uid: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    controller: OwnerRef | None = None  # the serving pod's is its PDDeployment, a probe pod's its Job
    created: str = ""
    deleting: bool = False
    phase: str | None = None
    reason: str | None = None
    ip: str | None = None
    node: str | None = None
    scheduled: bool = False
    scheduling_message: str | None = None
    containers: tuple[ContainerView, ...] = ()
    # taint key -> how long the pod tolerates that NoExecute taint (math.inf: forever); a key that is
    # missing is not tolerated at all. DefaultTolerationSeconds admission adds 300 s for both keys.
    node_loss_tolerations: Mapping[str, float] = field(default_factory=dict)
    claim_templates: tuple[str, ...] = ()  # ResourceClaimTemplates the spec refers to
    claims: Mapping[str, str] = field(default_factory=dict)  # pod claim name -> its ResourceClaim (status)

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    def container(self, name: str) -> ContainerView | None:
        return next((c for c in self.containers if c.name == name), None)


@dataclass(frozen=True)
class NodeView:
    """A Node's Ready condition: its status ("True", "False", "Unknown") and since when."""

    name: str
    ready: str = "Unknown"
    ready_since: str = ""  # the condition's lastTransitionTime (RFC 3339)
    ready_reason: str = ""

    @property
    def loss_taint(self) -> str | None:
        """The taint the node lifecycle controller gives this node, if it is not Ready."""
        if self.ready == "True" or not self.ready_since:
            return None
        return NOT_READY_TAINT if self.ready == "False" else UNREACHABLE_TAINT


@dataclass(frozen=True)
class JobView:
    """A probe Job: its name, whether it ended, and why it failed."""

    name: str
    uid: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    controller: OwnerRef | None = None
    finished: bool = False
    failure: str = NO_SUMMARY


def _container(cs: Mapping[str, Any]) -> ContainerView:
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated") or {}
    kind: ContainerState = "unknown"
    reason = message = ""
    terminated_message = None
    candidates: tuple[ContainerState, ...] = ("waiting", "running", "terminated")
    for candidate in candidates:
        if candidate in state:
            detail = state[candidate] or {}
            kind = candidate
            # While it waits to restart, the last termination's message says why it ended; the kubelet's
            # back-off note only says when it retries.
            first, second = (last, detail) if candidate == "waiting" else (detail, last)
            message = str(first.get("message") or second.get("message") or "")[:MESSAGE_LIMIT]
            reason = str(detail.get("reason") or ("" if candidate == "running" else last.get("reason", "")))
            if candidate == "terminated" and detail.get("message"):
                terminated_message = str(detail["message"])
            break
    ended = state.get("terminated") or last
    return ContainerView(
        name=str(cs.get("name", "")),
        ready=bool(cs.get("ready")),
        started=bool(cs.get("started")),
        restart_count=int(cs.get("restartCount") or 0),
        state=kind,
        reason=reason,
        message=message,
        terminated_message=terminated_message,
        exit_code=ended.get("exitCode") if isinstance(ended.get("exitCode"), int) else None,
        ended_message=str(ended.get("message") or ""),
    )


def _tolerates(toleration: Mapping[str, Any], key: str) -> bool:
    """Whether a toleration matches a value-less NoExecute taint `key` (core/v1 Toleration semantics)."""
    if toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    if toleration.get("key") not in (None, "", key):
        return False
    return toleration.get("operator") == "Exists" or not toleration.get("value")  # Equal: the taint has no value


def node_loss_tolerations(tolerations: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per node-loss taint, the pod's toleration time as the taint eviction controller reads it: the least
    tolerationSeconds of the matching tolerations, forever if none of them sets one."""
    found = {}
    for key in NODE_LOSS_TAINTS:
        matching = [t for t in tolerations if _tolerates(t, key)]
        if matching:
            seconds = [float(t["tolerationSeconds"]) for t in matching if t.get("tolerationSeconds") is not None]
            found[key] = max(min(seconds), 0.0) if seconds else math.inf
    return found


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    conditions: list[Mapping[str, Any]] = status.get("conditions") or []
    scheduled: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
    return PodView(
        name=str(meta.get("name", "")),
        uid=meta.get("uid"),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        controller=controller_ref(meta),
        created=str(meta.get("creationTimestamp") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        phase=status.get("phase"),
        reason=status.get("reason"),
        ip=status.get("podIP"),
        node=(obj.get("spec") or {}).get("nodeName"),
        scheduled=scheduled.get("status") == "True",
        scheduling_message=scheduled.get("message"),
        containers=tuple(_container(cs) for cs in status.get("containerStatuses") or []),
        claim_templates=tuple(
            str(c["resourceClaimTemplateName"])
            for c in (obj.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimTemplateName")
        ),
        claims={
            str(c.get("name")): str(c["resourceClaimName"])
            for c in status.get("resourceClaimStatuses") or []
            if c.get("resourceClaimName")
        },
        node_loss_tolerations=node_loss_tolerations((obj.get("spec") or {}).get("tolerations") or []),
    )


def node_view(obj: Mapping[str, Any]) -> NodeView:
    conditions: list[Mapping[str, Any]] = (obj.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return NodeView(
        name=str((obj.get("metadata") or {}).get("name", "")),
        ready=str(ready.get("status") or "Unknown"),
        ready_since=str(ready.get("lastTransitionTime") or ""),
        ready_reason=str(ready.get("reason") or ""),
    )


def _job_failure(conditions: list[Mapping[str, Any]]) -> str:
    for cond in conditions:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".strip()
    return NO_SUMMARY


def job_view(obj: Mapping[str, Any]) -> JobView:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    conditions = list(status.get("conditions") or [])
    ended = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)
    return JobView(
        name=str(meta.get("name", "")),
        uid=meta.get("uid"),
        labels=dict(meta.get("labels") or {}),
        controller=controller_ref(meta),
        finished=bool(status.get("succeeded") or status.get("failed") or ended),
        failure=_job_failure(conditions),
    )


@dataclass(frozen=True)
class ClaimView:
    """A ResourceClaim: what its status.allocation says it got (empty until the scheduler allocated it)."""

    name: str
    devices: tuple[AllocatedDevice, ...] = ()


def claim_view(obj: Mapping[str, Any]) -> ClaimView:
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return ClaimView(
        name=str((obj.get("metadata") or {}).get("name", "")),
        devices=tuple(
            AllocatedDevice(
                request=str(r.get("request", "")),
                driver=str(r.get("driver", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
            )
            for r in results
        ),
    )


@dataclass(frozen=True)
class DeploymentView:
    """The router Deployment's ready pods as its controller last counted them, for which generation."""

    name: str
    generation: int = 0
    observed_generation: int = 0  # the generation those counts are for
    ready_replicas: int = 0

    @property
    def observed(self) -> bool:
        """Whether the controller has seen the Deployment as last applied (else its counts may lag a change)."""
        return self.observed_generation >= self.generation


def deployment_view(obj: Mapping[str, Any]) -> DeploymentView:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    return DeploymentView(
        name=str(meta.get("name", "")),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
    )


@dataclass(frozen=True)
class ObjectView:
    """Who holds an object of a name the operator renders: its uid, its owner references and its labels."""

    kind: str
    name: str
    uid: str
    owners: tuple[OwnerRef, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def controller(self) -> OwnerRef | None:
        return next((ref for ref in self.owners if ref.controller), None)


def object_view(kind: str, obj: Mapping[str, Any]) -> ObjectView:
    meta = obj.get("metadata") or {}
    return ObjectView(
        kind=kind,
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        owners=owner_refs(meta),
        labels=dict(meta.get("labels") or {}),
        deleting=bool(meta.get("deletionTimestamp")),
    )
