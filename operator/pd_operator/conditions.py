"""Pure: every condition the operator writes on a PDDeployment, declared once (after KServe's condition set).

Each :class:`ConditionKind` names its type, the reasons it can carry, what sets it, whether it gates
``Ready`` and what it means. Code builds a condition only from a kind, with a reason of that kind's
``Literal``, so mypy refuses a misspelt type or a reason the table does not declare; ``observe.ready_set``
takes Ready's dependents from ``gates_ready``; docs/crd-reference.md lists the table (``crd.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar, get_args

from pd_operator.api import Phase

Reason = TypeVar("Reason", bound=str)
ContainerRole = Literal["prefill", "decode", "engine", "proxy"]

RoleReason = Literal[
    "NoPod", "PodTerminating", "PodOutdated", "PreflightFailed", "ContainersReady", "ContainersNotReady"
]
KvReason = Literal["NotApplicable", "NoProxy", "ProxyUnreachable", "NoTransferYet", "TransferCompleted", "KVMismatch"]
# Why the API server refused a child write (refusals.py), or why the operator leaves an object alone (ownership.py:
# NameConflict, NotOwned).
RefusalReason = Literal[
    "PodSecurity",
    "OwnerReferencesPermission",
    "RBAC",
    "ResourceQuota",
    "AdmissionWebhook",
    "AdmissionPolicy",
    "Forbidden",
    "NameConflict",
    "NotOwned",
    "ChildDeleted",
    "Invalid",
    "NotServed",
    "APIError",
]
ChildrenReason = Literal["Admitted", RefusalReason]
GoodputReason = Literal["ProbeDisabled", "NoProbeYet", "TargetMet", "TargetMissed"]
TunedReason = Literal["NoTrials", "Trialing", "Tuned"]
NodeLostReason = Literal["NodeNotReady", "NodeLost", "NodeReady", "Recovered"]
RouterReason = Literal["RouterUnreadable", "RouterNotFound", "RouterAvailable", "NoRouterPodReady"]
ScalingReason = Literal[
    "ScaledUp",
    "ScaledDown",
    "ScaledToBounds",
    "DemandWithinCapacity",
    "WaitingForReplicas",
    "NoCapacity",
    "NoDemand",
    "ReplicasOwnedElsewhere",
    "ScaleFailed",
]

# Reasons read back (compared, or turned into an Event) as well as written.
INVALID_SPEC: Final = "InvalidSpec"
PREFLIGHT_FAILED: Final[RoleReason] = "PreflightFailed"
KV_NOT_APPLICABLE: Final[KvReason] = "NotApplicable"
KV_MISMATCH: Final[KvReason] = "KVMismatch"
PROXY_UNREACHABLE: Final[KvReason] = "ProxyUnreachable"
NAME_CONFLICT: Final[RefusalReason] = "NameConflict"  # a child of a rendered name exists and another owner holds it
NOT_OWNED: Final[RefusalReason] = "NotOwned"  # a pod, Job or claim template carries our labels, another owner holds it
NODE_NOT_READY: Final[NodeLostReason] = "NodeNotReady"


@dataclass(frozen=True)
class ConditionKind(Generic[Reason]):
    """One condition type of the PDDeployment status and what is known about it."""

    type: str
    reasons: tuple[Reason, ...]
    set_by: str
    meaning: str
    gates_ready: bool = False
    role: ContainerRole | None = None  # a readiness condition of the pod's containers of this role
    more_reasons: str = ""  # reasons beyond ``reasons``, declared elsewhere (said in words)


def _role_ready(type_: str, role: ContainerRole, meaning: str) -> ConditionKind[RoleReason]:
    set_by = f"observe: the {role} container(s) of the serving pods"
    return ConditionKind(type_, get_args(RoleReason), set_by, meaning, gates_ready=True, role=role)


SPEC_VALID: Final[ConditionKind[str]] = ConditionKind(
    "SpecValid",
    ("Valid", INVALID_SPEC),
    "observe: the spec's validation (validation.py: the API's rules; policy.py: the tenancy policy)",
    "The spec passed the API's rules and the operator's tenancy policy; while False nothing is created or changed.",
    gates_ready=True,
    more_reasons="the tenancy policy's rule the spec breaks, e.g. `HostPathNotAllowed` (docs/security.md)",
)
PREFILL_READY: Final = _role_ready(
    "PrefillReady", "prefill", "Every prefill engine container of every replica is ready (disaggregated)."
)
DECODE_READY: Final = _role_ready(
    "DecodeReady", "decode", "Every decode engine container of every replica is ready (disaggregated)."
)
ENGINE_READY: Final = _role_ready(
    "EngineReady", "engine", "Every engine container of every replica is ready (colocated)."
)
PROXY_READY: Final = _role_ready("ProxyReady", "proxy", "The proxy container of every replica is ready.")
READY: Final[ConditionKind[Phase]] = ConditionKind(
    "Ready",
    get_args(Phase),
    "observe: the phase, from the condition set of Ready",
    "Serving: True exactly when every condition that gates Ready is True on every replica; its reason is the phase.",
)
KV_TRANSFER_VERIFIED: Final[ConditionKind[KvReason]] = ConditionKind(
    "KVTransferVerified",
    get_args(KvReason),
    "observe: each replica proxy's admin `/status` (`last_transfer`, `canary.kv_mismatch`)",
    "A transfer's prefill and decode legs both succeeded (user traffic, the canary or a probe), on every replica; "
    "True for the life of the pod unless the canary finds decode's greedy tokens after a transfer differ from "
    "prefill's own: then False (`KVMismatch`, with the first differing token position; see "
    "`spec.proxy.onKvMismatch`) while that proxy reports it. "
    "Unknown (`NotApplicable`) in colocated mode.",
)
GOODPUT_MET: Final[ConditionKind[GoodputReason]] = ConditionKind(
    "GoodputMet",
    get_args(GoodputReason),
    "observe: the latest goodput probe's result (goodput.py)",
    "The last probe's SLO attainment >= `spec.goodputProbe.slo.target` at the configured rate; Unknown until a "
    "probe ran or with the probe disabled.",
)
CHILDREN_ADMITTED: Final[ConditionKind[ChildrenReason]] = ConditionKind(
    "ChildrenAdmitted",
    get_args(ChildrenReason),
    "observe: the API server's refusals of child writes (refusals.py; ownership.py for `NameConflict` and `NotOwned`)",
    "The API server accepted every child; False names the object, the policy that refused it and the fields "
    "at fault (its reason is the policy); `NameConflict`: an object of a rendered name belongs to another owner; "
    "`NotOwned`: a pod, Job or claim template carries this PDDeployment's labels but another controller (or none "
    "the adoption rule admits) holds it, so the operator leaves it alone.",
)
TUNED: Final[ConditionKind[TunedReason]] = ConditionKind(
    "Tuned",
    get_args(TunedReason),
    "observe: autotuning's state (autotune.py), with `spec.autotune.enabled`",
    "False while autotuning's trials run, True once the best layout is in force.",
)
NODE_LOST: Final[ConditionKind[NodeLostReason]] = ConditionKind(
    "NodeLost",
    get_args(NodeLostReason),
    "observe: the Nodes of the serving pods (`serving_pods.node_trouble`)",
    "Shown from the first time a serving pod's node is NotReady or unreachable: False (`NodeNotReady`) within "
    "the grace, True (`NodeLost`) once the pod is force-deleted (zero grace: its kubelet will never confirm) and "
    "recreated on a node with free GPUs, until the new pod is Ready; then False (`Recovered`, or `NodeReady` if "
    "the node came back in time).",
)
ROUTER_READY: Final[ConditionKind[RouterReason]] = ConditionKind(
    "RouterReady",
    get_args(RouterReason),
    "observe: the router Deployment, with `spec.router.enabled`",
    "At least one router pod is ready (the router's Service answers); Unknown while its Deployment does not "
    "exist yet or cannot be read.",
)
SCALING_ACTIVE: Final[ConditionKind[ScalingReason]] = ConditionKind(
    "ScalingActive",
    get_args(ScalingReason),
    "autoscale.decide, through decide (`spec.autoscaling.enabled`)",
    "True while the operator sets replicas from demand and capacity (`WaitingForReplicas`: a scale-down waits "
    "for every replica to be available); False when it cannot: `NoCapacity`, `NoDemand` (no ready proxy "
    "reported yet), `ReplicasOwnedElsewhere` (an HPA targets this PDDeployment: capacity and demand are only "
    "published) or `ScaleFailed` (the scale write was refused; the Event says why).",
)

# In the order the status lists them.
TABLE: Final[tuple[ConditionKind[Any], ...]] = (
    SPEC_VALID,
    PREFILL_READY,
    DECODE_READY,
    ENGINE_READY,
    PROXY_READY,
    READY,
    KV_TRANSFER_VERIFIED,
    GOODPUT_MET,
    CHILDREN_ADMITTED,
    TUNED,
    NODE_LOST,
    ROUTER_READY,
    SCALING_ACTIVE,
)
ROLE_READY: Final[Mapping[ContainerRole, ConditionKind[RoleReason]]] = {
    kind.role: kind for kind in (PREFILL_READY, DECODE_READY, ENGINE_READY, PROXY_READY) if kind.role
}


def ready_gates(roles: Collection[str]) -> tuple[ConditionKind[Any], ...]:
    """What Ready waits for in a pod whose containers have ``roles``: every gate but other roles' readiness."""
    return tuple(kind for kind in TABLE if kind.gates_ready and (kind.role is None or kind.role in roles))
