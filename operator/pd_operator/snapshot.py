"""Pure: what one reconciliation decides from. The PDDeployment as kopf delivered it, and the :class:`Snapshot`
the shell gathers around it (its pods and Jobs, the proxies' reports, what the core asked it to read, the time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from pd_operator import autoscale, autotune, layout, policy, render
from pd_operator.api import PDDeploymentSpec
from pd_operator.observe import ProxyReport, RouterRead
from pd_operator.refusals import ApiFailure
from pd_operator.settings import Settings
from pd_operator.validation import SpecError, validate_spec
from pd_operator.views import ClaimView, JobView, NodeView, ObjectView, PodView


@dataclass(frozen=True)
class Deployment:
    """One PDDeployment as kopf delivered it."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    tenancy: policy.TenancyPolicy = policy.DEFAULT_POLICY  # what the spec may ask for (pdctl operator --policy)

    @cached_property
    def checked(self) -> PDDeploymentSpec | SpecError:
        """The spec validated and inside the tenancy policy, once per snapshot: every step of one reconcile
        reads this, so a spec outside the policy creates and changes nothing."""
        try:
            return policy.enforce(validate_spec(self.spec), self.tenancy, namespace=self.namespace)
        except SpecError as exc:
            return exc

    @property
    def valid_spec(self) -> PDDeploymentSpec | None:
        """The spec, or None when invalid (then only :func:`decide` has something to say: SpecValid=False)."""
        checked = self.checked
        return None if isinstance(checked, SpecError) else checked

    @property
    def owner(self) -> layout.Owner:
        """Its children's owner: what every rendered object and owner reference names."""
        return layout.Owner(name=self.name, namespace=self.namespace, uid=self.uid, generation=self.generation)


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconciliation decides from."""

    deployment: Deployment
    now: datetime
    pods: Sequence[PodView] = ()  # the pods with its labels (kopf index): its own, its Jobs', and any other's
    jobs: Sequence[JobView] = ()  # the Jobs with its labels (kopf index): its probe Jobs, and any other's
    proxies: Mapping[str, ProxyReport] = field(default_factory=dict)  # pod name -> report, from proxy_urls()
    repair_children: bool = True  # apply the Service, NetworkPolicy (and claim template) this time
    failed: Mapping[str, ApiFailure] = field(default_factory=dict)  # Action.key -> error, from executing once
    nodes: Mapping[str, NodeView] = field(default_factory=dict)  # the serving pods' nodes, by name (kopf index)
    node_lost_grace_s: float = Settings.node_lost_grace_seconds
    probe_image: str | None = None  # the goodput probe Job's image (the operator's); None: the runtime image
    operator_namespace: str = render.OPERATOR_NAMESPACE  # the serving NetworkPolicy admits the operator from it
    claim_templates: Sequence[ObjectView] = ()  # the ResourceClaimTemplates with its labels, from claim_reads()
    claims: Mapping[str, ClaimView] = field(default_factory=dict)  # ResourceClaim name -> view, from claim_reads()
    seen: Mapping[str, ObjectView | None] = field(
        default_factory=dict
    )  # Kind/name -> read (None: absent), object_reads()
    unread: frozenset[str] = frozenset()  # Kind/name object_reads() asked for whose read failed
    known: Mapping[str, str] = field(default_factory=dict)  # Kind/name -> uid of a child this operator applied as ours
    reread: ObjectView | None = None  # this PDDeployment read again when owner_read() asks (None: not read, or gone)
    plan: autotune.Plan | None = None  # autotune's trials for a new workload, planned when plan_for() asks
    router: RouterRead | None = None  # the router Deployment, read when router_read() asks (status.router)
    hpas: Sequence[str] | None = (
        None  # HorizontalPodAutoscalers targeting it, listed when hpa_read() asks (None: unread)
    )
    predictions: autoscale.Predictions | None = None  # the planner's capacity, when prediction_queries() asks
