"""kopf handlers: gather a snapshot, let :func:`decide.decide` choose, execute its actions, write its status.

One idempotent :func:`reconcile` serves every trigger (create, update of the spec, resume after an
operator restart, and a periodic timer that also notices deleted pods, proxy progress and probe Jobs).
It never raises for a bad spec or a failed API call: a bad spec becomes SpecValid=False, an API error a
log line, a metric and (where the user should know) a status message. Pods, probe Jobs and Nodes come
from kopf indexes fed by watches, as typed views, so a steady-state tick costs no API request but one GET
of the router Deployment (with spec.router.enabled, for its status); the other children are re-applied
every ``drift_repair_seconds``. Settings and connections live in kopf's memo.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

import httpx
import kopf

from pd_operator import api, autoscale, autotune, command_lines, decide, layout, metrics, render
from pd_operator.actions import Action, Adopt, Apply, Create, CreateSecret, Decision, Delete, Emit, Scale
from pd_operator.kube import Kube, KubeError
from pd_operator.observe import ProxyReport, RouterRead
from pd_operator.ownership import owned
from pd_operator.refusals import ApiFailure
from pd_operator.settings import Settings
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.views import (
    JobView,
    NodeView,
    ObjectView,
    PodView,
    claim_view,
    deployment_view,
    job_view,
    node_view,
    object_view,
    pod_view,
)

log = logging.getLogger(__name__)
Obj = dict[str, Any]
T = TypeVar("T")
V = TypeVar("V")
MANAGED_BY = {render.LABEL_MANAGED_BY: render.MANAGER}
_PROBE_METRICS = {"GoodputProbeStarted": "started", "GoodputMeasured": "succeeded", "GoodputProbeFailed": "failed"}


class KubeLike(Protocol):
    async def apply(self, obj: Obj) -> Obj: ...
    async def create(self, obj: Obj) -> Obj | None: ...
    async def delete(
        self, kind: str, namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None
    ) -> bool: ...
    async def get(self, kind: str, namespace: str, name: str) -> Obj | None: ...
    async def items(self, kind: str, namespace: str, label_selector: str = "") -> list[Obj]: ...
    async def patch(self, kind: str, namespace: str, name: str, body: Obj) -> Obj: ...
    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None: ...


async def fetch_proxy_status(
    url: str, admin_key: str | None, timeout_s: float = Settings.proxy_timeout_seconds
) -> ProxyReport:
    """GET the proxy's admin /status (contract 3) with its admin key; any failure is a report, not an exception."""
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(url, headers=headers)
        if response.status_code != 200:
            return ProxyReport(error=f"HTTP {response.status_code}")
        body = response.json()
        return ProxyReport(status=body) if isinstance(body, dict) else ProxyReport(error="not a JSON object")
    except (httpx.HTTPError, ValueError) as exc:
        return ProxyReport(error=f"{type(exc).__name__}: {exc}")


@dataclass
class Deps:
    """The operator's connections to the world, replaceable in tests."""

    kube: KubeLike
    fetch_proxy_status: Callable[[str, str | None], Awaitable[ProxyReport]]  # (url, admin key)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


@dataclass
class Operator:
    """What every handler shares, kept in kopf's memo (``memo.operator``)."""

    settings: Settings
    deps: Deps | None = None  # made at startup unless given (tests, embedding)


@dataclass
class ObjectState:
    """Per-PDDeployment state, kept in its own kopf memo (``memo.object``)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    children_applied: float = -math.inf  # time.monotonic() of the last drift repair
    known: dict[str, str] = field(default_factory=dict)  # Kind/name -> uid of each child applied as ours
    keys: dict[str, str] = field(default_factory=dict)  # its proxies' admin key, once read (admin_key())


# ---- reconcile ---------------------------------------------------------------------------------------------


def with_drawn_keys(action: CreateSecret) -> Obj:
    """The Secret with a fresh random value for each of its keys."""
    return {**action.obj, "stringData": {key: secrets.token_urlsafe(render.KEY_BYTES) for key in action.keys}}


async def _execute(kube: KubeLike, d: Deployment, action: Action, known: dict[str, str]) -> bool:
    """Whether it wrote: an apply that changed nothing and a delete of what was gone are no writes. An
    applied child the answer shows to be ours is remembered in ``known`` (its uid)."""
    if isinstance(action, Apply):
        applied = object_view(action.obj["kind"], await kube.apply(action.obj))
        if owned(applied, d):
            known[applied.key] = applied.uid
        return False
    if isinstance(action, Create):
        await kube.create(action.obj)
        return True
    if isinstance(action, CreateSecret):  # 409 (it exists): left as it is
        return await kube.create(with_drawn_keys(action)) is not None
    if isinstance(action, Scale):
        await kube.scale(action.kind, d.namespace, action.name, action.replicas)
        return True
    if isinstance(action, Adopt):
        await kube.patch(action.kind, d.namespace, action.name, action.patch)
        return True
    assert isinstance(action, Delete)
    return await kube.delete(action.kind, d.namespace, action.name, action.grace_seconds, action.uid)


async def execute(
    kube: KubeLike, snap: Snapshot, actions: tuple[Action, ...], known: dict[str, str] | None = None
) -> dict[str, ApiFailure]:
    """Run the API actions in order; returns the failures by action key (Events are posted by kopf).
    ``known`` (Kind/name -> uid of the children applied as ours) follows what the applies answered."""
    d, failed, known = snap.deployment, {}, {} if known is None else known
    for action in actions:
        if isinstance(action, Emit):
            continue
        kind = action.kind if isinstance(action, Adopt | Delete | Scale) else action.obj["kind"]
        try:
            wrote = await _execute(kube, d, action, known)
        except KubeError as exc:
            metrics.RECONCILE_ERRORS.labels(kind).inc()
            log.warning("%s/%s: cannot %s: %s", d.namespace, d.name, action.key, exc)
            failed[action.key] = exc.failure
            if isinstance(action, Apply):
                known.pop(action.key.split(" ", 1)[1], None)  # read again on the next repair
            continue
        if wrote:
            metrics.CHILD_WRITES.labels(kind, action.key.split()[0]).inc()
            log.info("%s/%s: %s", d.namespace, d.name, action.key)
    return failed


async def _read(d: Deployment, kind: str, what: str, read: Awaitable[T]) -> T | None:
    """One read the core asked for; a failure is logged and counted (as ``kind``), and reads as nothing."""
    try:
        return await read
    except KubeError as exc:
        metrics.RECONCILE_ERRORS.labels(kind).inc()
        log.warning("%s/%s: cannot read %s: %s", d.namespace, d.name, what, exc)
        return None


async def read_claims(kube: KubeLike, snap: Snapshot) -> Snapshot:
    """DRA: the deployment's claim templates and its pods' ResourceClaims, as ``decide.claim_reads`` asks,
    all read at once. A failed read leaves its part empty: a failed listing deletes no template, and the
    status waits for a claim that could not be read."""
    reads, d = decide.claim_reads(snap), snap.deployment
    if not reads.templates:  # not DRA: nothing to read
        return snap
    claim, kind = "ResourceClaim", "ResourceClaimTemplate"
    listing = _read(d, claim, f"{kind}s", kube.items(kind, d.namespace, _selector(d.name)))
    gets = (_read(d, claim, f"{claim}/{n}", kube.get(claim, d.namespace, n)) for n in reads.claims)
    templates, found = await asyncio.gather(listing, asyncio.gather(*gets))
    claims = {n: claim_view(obj) for n, obj in zip(reads.claims, found, strict=True) if obj is not None}
    views = [object_view(kind, obj) for obj in templates or []]
    return dataclasses.replace(snap, claim_templates=views, claims=claims)


def _selector(name: str) -> str:
    """The label selector of what carries the PDDeployment ``name``'s labels (the pod and Job indexes' too)."""
    return f"{render.LABEL_MANAGED_BY}={render.MANAGER},{render.LABEL_DEPLOYMENT}={name}"


async def read_router(kube: KubeLike, snap: Snapshot) -> Snapshot:
    """The router Deployment's counts, once per reconcile as ``decide.router_read`` asks (router enabled)."""
    name, d = decide.router_read(snap), snap.deployment
    if name is None:
        return snap

    async def get() -> RouterRead:
        obj = await kube.get("Deployment", d.namespace, name)
        return RouterRead(deployment_view(obj) if obj is not None else None)

    read = await _read(d, "Deployment", f"Deployment/{name}", get())
    return dataclasses.replace(snap, router=read if read is not None else RouterRead(failed=True))


async def read_objects(kube: KubeLike, snap: Snapshot) -> Snapshot:
    """GET what ``decide.object_reads`` asks for, each round at once, until it asks for nothing more. A failed
    read is ``unread``: the core applies such a child only if known to be ours, and deletes nothing unread."""
    d, children = snap.deployment, decide.applied_children(snap)
    while reads := decide.object_reads(snap, children):
        got = await asyncio.gather(*(_read(d, k, f"{k}/{n}", _get_or_absent(kube, d, k, n)) for k, n in reads))
        keys = [f"{k}/{n}" for k, n in reads]
        seen = {key: obj.view for key, obj in zip(keys, got, strict=True) if obj is not None}
        unread = {key for key, obj in zip(keys, got, strict=True) if obj is None}
        snap = dataclasses.replace(snap, seen={**snap.seen, **seen}, unread=snap.unread | unread)
    return snap


async def read_owner(kube: KubeLike, snap: Snapshot) -> Snapshot:
    """The PDDeployment read again (a GET, from etcd, not kopf's cached body) when ``decide.owner_read`` asks:
    an orphan is adopted only if this is still the same PDDeployment and it is not being deleted."""
    d = snap.deployment
    if not decide.owner_read(snap):
        return snap
    found = await _read(d, api.KIND, f"{api.KIND}/{d.name}", kube.get(api.KIND, d.namespace, d.name))
    return dataclasses.replace(snap, reread=object_view(api.KIND, found) if found is not None else None)


@dataclass(frozen=True)
class _Got:
    view: ObjectView | None  # None: absent


async def _get_or_absent(kube: KubeLike, d: Deployment, kind: str, name: str) -> _Got:
    obj = await kube.get(kind, d.namespace, name)
    return _Got(object_view(kind, obj) if obj is not None else None)


async def read_hpas(kube: KubeLike, snap: Snapshot) -> Snapshot:
    """The HorizontalPodAutoscalers whose scaleTargetRef is this PDDeployment, as ``decide.hpa_read`` asks
    (one LIST of the namespace per reconcile); a failed read leaves them unknown."""
    d = snap.deployment
    if not decide.hpa_read(snap):
        return snap
    kind = "HorizontalPodAutoscaler"
    found = await _read(d, kind, "HorizontalPodAutoscalers", kube.items(kind, d.namespace))
    if found is None:
        return snap
    return dataclasses.replace(snap, hpas=sorted(h["metadata"]["name"] for h in found if targets(h, d.name)))


def targets(hpa: Mapping[str, Any], name: str) -> bool:
    """Whether a HorizontalPodAutoscaler scales the PDDeployment ``name`` (its scaleTargetRef)."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    group = str(ref.get("apiVersion", "")).split("/")[0]
    return ref.get("kind") == api.KIND and ref.get("name") == name and group == api.GROUP


async def plan(snap: Snapshot) -> Snapshot:
    """Autotune: plan a new workload's trials in a worker thread, as the planner's simulation takes 0.3-0.7 s
    of CPU that would otherwise stall every other handler on kopf's event loop."""
    spec = decide.plan_for(snap)
    if spec is None:
        return snap
    return dataclasses.replace(snap, plan=await asyncio.to_thread(autotune.plan, spec))


async def predict(snap: Snapshot) -> Snapshot:
    """Autoscaling: the planner's capacity predictions in a worker thread (cached per workload; a new one
    costs a simulation of 0.2-2 s of CPU)."""
    asked = decide.prediction_queries(snap)
    if asked is None:
        return snap
    return dataclasses.replace(snap, predictions=await asyncio.to_thread(autoscale.predictions, *asked))


async def admin_key(kube: KubeLike, d: Deployment, cache: dict[str, str]) -> str | None:
    """The admin key of the deployment's proxies, from its credentials Secret: read once and kept in
    ``cache`` (the Secret is never rewritten); None while it cannot be read (then /status answers 401)."""
    if command_lines.ADMIN_KEY not in cache:
        name = layout.credentials_name(layout.Owner(d.name, d.namespace))
        secret = await _read(d, "Secret", f"Secret {name}", kube.get("Secret", d.namespace, name))
        encoded = ((secret or {}).get("data") or {}).get(command_lines.ADMIN_KEY)
        if encoded:
            cache[command_lines.ADMIN_KEY] = base64.b64decode(encoded).decode()
    return cache.get(command_lines.ADMIN_KEY)


async def reconcile(
    snap: Snapshot, deps: Deps, known: dict[str, str] | None = None, keys: dict[str, str] | None = None
) -> Decision:
    """Read what the core asks for (the proxies, the DRA claims, the router Deployment, the children and
    leftovers not known to be ours: each kind at once; the PDDeployment again before adopting), plan (once, in
    a worker thread), decide, act; decide again if an action failed. ``known`` (the children applied as ours,
    by Kind/name) is kept current, and ``keys`` the proxies' admin key once read."""
    known = {} if known is None else known
    urls = decide.proxy_urls(snap)
    if urls:
        key = await admin_key(deps.kube, snap.deployment, {} if keys is None else keys)
        reports = await asyncio.gather(*(deps.fetch_proxy_status(url, key) for url in urls.values()))
        for report in reports:
            if report.error:
                metrics.RECONCILE_ERRORS.labels("proxy").inc()
        snap = dataclasses.replace(snap, proxies=dict(zip(urls, reports, strict=True)))
    snap = await plan(await read_hpas(deps.kube, await read_router(deps.kube, await read_claims(deps.kube, snap))))
    snap = await predict(snap)
    snap = await read_owner(deps.kube, await read_objects(deps.kube, snap))
    decision = decide.decide(snap)
    failed = await execute(deps.kube, snap, decision.actions, known)
    if failed:
        decision = decide.decide(dataclasses.replace(snap, failed=failed))
    for event in decision.events:
        if event.reason in _PROBE_METRICS:
            metrics.PROBES.labels(_PROBE_METRICS[event.reason]).inc()
    return decision


# ---- kopf wiring ---------------------------------------------------------------------------------------------


Owner = tuple[str | None, str]
"""A PDDeployment's (namespace, name): the key of the pods and Jobs it owns in their indexes."""
PodIndex = kopf.Index[Owner, PodView]
JobIndex = kopf.Index[Owner, JobView]
NodeIndex = kopf.Index[str, NodeView]


@dataclass(frozen=True)
class Indexes:
    """The kopf indexes a reconcile reads."""

    pods: PodIndex
    jobs: JobIndex
    nodes: NodeIndex

    @classmethod
    def passed(cls, kwargs: Mapping[str, Any]) -> Indexes:
        """The indexes kopf passes a handler, each as the keyword its index function is named. They are not
        parameters of the handlers: kopf's callback protocols, which mypy checks every registration against,
        admit no required keyword of an operator's own."""
        return cls(kwargs[pd_pods.__name__], kwargs[pd_jobs.__name__], kwargs[pd_nodes.__name__])


def _operator(memo: kopf.Memo) -> Operator:
    operator = memo["operator"]
    assert isinstance(operator, Operator), "pdctl operator puts an Operator in kopf's memo"
    return operator


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # Events come from the core's decisions, not from every log line
    operator = _operator(memo)
    if operator.deps is None:
        timeout = operator.settings.proxy_timeout_seconds
        kube = Kube.from_environment(field_manager=operator.settings.field_manager)
        operator.deps = Deps(kube=kube, fetch_proxy_status=partial(fetch_proxy_status, timeout_s=timeout))


def _by_owner(
    view: Callable[[kopf.Body], V], body: kopf.Body, namespace: str | None, labels: kopf.Labels
) -> dict[Owner, V] | None:
    owner = labels.get(render.LABEL_DEPLOYMENT)
    return {(namespace, owner): view(body)} if owner else None


def pd_pods(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> dict[Owner, PodView] | None:
    """Serving and probe pods by (namespace, PDDeployment name), as views kept current by a watch."""
    return _by_owner(pod_view, body, namespace, labels)


def pd_jobs(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> dict[Owner, JobView] | None:
    """Probe Jobs by (namespace, PDDeployment name)."""
    return _by_owner(job_view, body, namespace, labels)


def pd_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeView]:
    """Every Node's Ready condition by name: where the serving pods run, and whether those nodes live."""
    return {name: node_view(body)}


def _snapshot(body: kopf.Body, indexes: Indexes, now: datetime, repair: bool, settings: Settings) -> Snapshot:
    meta = body.metadata
    key = (str(meta.namespace), str(meta.name))
    deployment = Deployment(
        name=key[1],
        namespace=key[0],
        uid=str(meta.uid),
        generation=int(meta.get("generation") or 0),
        spec=dict(body.spec),
        status=dict(body.status),
        annotations=dict(meta.annotations),
        tenancy=settings.policy,
    )
    pods, jobs = list(indexes.pods.get(key, [])), list(indexes.jobs.get(key, []))
    nodes = {p.node: next(iter(indexes.nodes[p.node])) for p in pods if p.node and indexes.nodes.get(p.node)}
    return Snapshot(
        deployment,
        now,
        pods=pods,
        jobs=jobs,
        repair_children=repair,
        nodes=nodes,
        node_lost_grace_s=settings.node_lost_grace_seconds,
        probe_image=settings.probe_image,
        operator_namespace=settings.operator_namespace,
    )


async def _handle(trigger: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, indexes: Indexes) -> None:
    operator = _operator(memo)
    assert operator.deps is not None, "configure() ran at startup"
    state: ObjectState = memo.setdefault("object", ObjectState())
    async with state.lock:
        repair = (
            trigger != "timer"
            or time.monotonic() - state.children_applied > operator.settings.drift_repair_seconds
            or decide.children_refused(body.status)
        )
        if repair:
            state.children_applied = time.monotonic()
        snap = dataclasses.replace(
            _snapshot(body, indexes, operator.deps.now(), repair, operator.settings), known=dict(state.known)
        )
        with metrics.RECONCILE_SECONDS.labels(trigger).time():
            decision = await reconcile(snap, operator.deps, state.known, keys=state.keys)
    patch.status.update(decision.patch)
    d = snap.deployment
    metrics.set_phase(d.namespace, d.name, decision.status.phase)
    metrics.set_scaling(d.namespace, d.name, decision.status)
    metrics.RECONCILES.labels(trigger, "changed" if decision.patch else "unchanged").inc()
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


async def on_change(reason: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    await _handle(reason, body, patch, memo, Indexes.passed(kwargs))


async def resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    await _handle("timer", body, patch, memo, Indexes.passed(kwargs))


def on_delete(namespace: str | None, name: str, **_: Any) -> None:
    """Children go with the owner (garbage collection via owner references); only forget the metrics."""
    metrics.forget(str(namespace), name)
    log.info("%s/%s deleted; its children follow through owner references", namespace, name)


def registry(settings: Settings) -> kopf.OperatorRegistry:
    """The operator's handlers, registered with the intervals of these settings."""
    reg = kopf.OperatorRegistry()
    resource = (api.GROUP, api.VERSION, api.PLURAL)
    kopf.on.login(registry=reg)(kopf.login_via_client)  # the kubernetes client's credentials, as kube.py
    kopf.on.startup(registry=reg)(configure)
    kopf.index("pods", labels=MANAGED_BY, registry=reg)(pd_pods)
    kopf.index("batch", "v1", "jobs", labels=MANAGED_BY, registry=reg)(pd_jobs)
    kopf.index("", "v1", "nodes", registry=reg)(pd_nodes)
    kopf.on.resume(*resource, registry=reg)(on_change)
    kopf.on.create(*resource, registry=reg)(on_change)
    kopf.on.update(*resource, field="spec", registry=reg)(on_change)
    interval = settings.resync_seconds
    kopf.timer(*resource, interval=interval, initial_delay=interval, registry=reg)(resync)
    kopf.on.delete(*resource, optional=True, registry=reg)(on_delete)
    return reg
