"""kopf handlers: gather what the cluster says, call the pure core, apply its answer.

One idempotent :func:`reconcile` serves every trigger (create, update of the spec, resume after an
operator restart, and a periodic timer that also notices deleted pods, proxy progress and probe Jobs).
It never raises for a bad spec or a failed API call: a bad spec becomes SpecValid=False, an API error a
log line and a metric, and the next timer tick tries again. Pods and probe Jobs are read from kopf
indexes fed by watches, so a steady-state tick costs no API request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import kopf

from pd_operator import api, goodput, metrics, observe, render
from pd_operator.kube import Kube, KubeError, Outcome
from pd_operator.observe import Event, ProxyReport, Snapshot
from pd_operator.validation import SpecError, validate_spec

log = logging.getLogger(__name__)
Obj = dict[str, Any]
RESYNC_SECONDS = float(os.environ.get("PD_OPERATOR_RESYNC_SECONDS", "5"))
CHILDREN_RESYNC_SECONDS = 300.0  # drift repair of Service/NetworkPolicy; spec changes apply at once
PROXY_TIMEOUT_S = 2.0
MANAGED_BY = {"app.kubernetes.io/managed-by": "pd-operator"}


class KubeLike(Protocol):
    async def create(self, obj: Obj) -> Obj | None: ...
    async def delete(self, kind: str, namespace: str, name: str) -> bool: ...
    async def ensure(self, desired: Obj) -> Outcome: ...


@dataclass
class Deps:
    """The operator's connections to the world, replaceable in tests."""

    kube: KubeLike
    fetch_proxy_status: Callable[[str], Awaitable[ProxyReport]]
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


@dataclass(frozen=True)
class Target:
    """One PDDeployment as kopf delivered it, plus its pods and probe Jobs from the indexes."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str] = field(default_factory=dict)
    pods: Sequence[Mapping[str, Any]] = ()
    jobs: Sequence[Mapping[str, Any]] = ()
    check_children: bool = True  # the Service and NetworkPolicy are re-read only now and then


@dataclass
class Result:
    """What to write: changed status fields (None deletes) and Events to post."""

    status: Obj
    events: list[Event]


async def fetch_proxy_status(url: str) -> ProxyReport:
    """GET the proxy's admin /status (contract 3); any failure is a report, not an exception."""
    try:
        async with httpx.AsyncClient(timeout=PROXY_TIMEOUT_S) as http:
            response = await http.get(url)
        if response.status_code != 200:
            return ProxyReport(error=f"HTTP {response.status_code}")
        body = response.json()
        return ProxyReport(status=body) if isinstance(body, dict) else ProxyReport(error="not a JSON object")
    except (httpx.HTTPError, ValueError) as exc:
        return ProxyReport(error=f"{type(exc).__name__}: {exc}")


# ---- reconcile ---------------------------------------------------------------------------------------------


def _component(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(render.LABEL_COMPONENT)
    return str(value) if value is not None else None


async def _ensure_children(kube: KubeLike, owner: render.Owner, spec: api.PDDeploymentSpec) -> None:
    for obj in render.children(owner, spec)[:-1]:  # the pod is handled by _converge_pod
        try:
            outcome = await kube.ensure(obj)
        except KubeError as exc:
            metrics.RECONCILE_ERRORS.labels("children").inc()
            log.warning("%s/%s: cannot apply %s: %s", owner.namespace, owner.name, obj["kind"], exc)
            continue
        if outcome != "unchanged":
            metrics.CHILD_WRITES.labels(obj["kind"], outcome).inc()
            log.info("%s/%s: %s %s", owner.namespace, owner.name, outcome, obj["kind"])


_POD_EVENTS = {
    "create": Event("Normal", "CreatedPod", "created the serving pod"),
    "roll": Event("Normal", "RollingPod", "the spec changed: deleting the serving pod to recreate it"),
    "replace": Event("Warning", "ReplacingPod", "the serving pod ended: deleting it to recreate it"),
}


@dataclass
class PodOutcome:
    pod: Mapping[str, Any] | None
    current: bool
    error: str | None = None
    events: list[Event] = field(default_factory=list)


async def _converge_pod(
    kube: KubeLike, owner: render.Owner, spec: api.PDDeploymentSpec, live: Mapping[str, Any] | None
) -> PodOutcome:
    """Create, keep or delete the serving pod (deleted pods come back on the next pass)."""
    desired = render.pod(owner, spec)
    action = observe.pod_action(live, desired, render.ANNOTATION_SPEC_HASH)
    if action in ("keep", "wait"):
        return PodOutcome(live, action == "keep")
    event = _POD_EVENTS[action]
    try:
        if action == "create":
            created = await kube.create(desired)
            live = created or desired
        else:
            await kube.delete("Pod", owner.namespace, render.pod_name(owner))
    except KubeError as exc:
        metrics.RECONCILE_ERRORS.labels("pod").inc()
        log.warning("%s/%s: cannot %s the pod: %s", owner.namespace, owner.name, action, exc)
        return PodOutcome(live, False, error=f"cannot {action} the serving pod: {exc}")
    metrics.CHILD_WRITES.labels("Pod", action).inc()
    log.info("%s/%s: %s", owner.namespace, owner.name, event.message)
    return PodOutcome(live, action == "create", events=[event])


async def _poll_proxy(
    deps: Deps, spec: api.PDDeploymentSpec, pod: Mapping[str, Any] | None, previous: Mapping[str, Any]
) -> ProxyReport | None:
    if pod is None or spec.mode != "disaggregated" or observe.kv_transfer_verified(previous, pod):
        return None
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    report = await deps.fetch_proxy_status(f"http://{ip}:{spec.proxy.admin_port}/status")
    if report.error:
        metrics.RECONCILE_ERRORS.labels("proxy").inc()
    return report


@dataclass
class ProbeOutcome:
    probe: Obj
    goodput: Obj | None = None
    events: list[Event] = field(default_factory=list)


def _job_pods(t: Target, job_name: str) -> list[Mapping[str, Any]]:
    return [p for p in t.pods if ((p.get("metadata") or {}).get("labels") or {}).get("job-name") == job_name]


async def _collect_finished(deps: Deps, t: Target, spec: api.PDDeploymentSpec, out: ProbeOutcome) -> list[str]:
    """Read and delete finished probe Jobs; returns the names of the Jobs still running."""
    running = []
    for job in t.jobs:
        name = str((job.get("metadata") or {}).get("name"))
        if not goodput.job_finished(job) and spec.goodput_probe.enabled:
            running.append(name)
            continue
        pods = _job_pods(t, name)
        if name == out.probe.get("jobName"):
            _record_result(deps, t, spec, job, pods, out)
        try:
            await deps.kube.delete("Job", t.namespace, name)
            for pod in pods:
                await deps.kube.delete("Pod", t.namespace, str(pod["metadata"]["name"]))
        except KubeError as exc:
            metrics.RECONCILE_ERRORS.labels("probe").inc()
            log.warning("%s/%s: cannot delete probe Job %s: %s", t.namespace, t.name, name, exc)
    return running


def _record_result(
    deps: Deps,
    t: Target,
    spec: api.PDDeploymentSpec,
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    out: ProbeOutcome,
) -> None:
    message = goodput.termination_message(pods)
    out.probe.update(jobName=None, lastFinishedAt=goodput.rfc3339(deps.now()))
    try:
        if message is None:
            raise goodput.SummaryError(goodput.job_failure(job))
        out.goodput = goodput.goodput_status(goodput.parse_summary(message), spec, t.generation)
    except goodput.SummaryError as exc:
        out.probe["lastError"] = str(exc)[:1024]
        out.events.append(Event("Warning", "GoodputProbeFailed", str(exc)[:1024]))
        metrics.PROBES.labels("failed").inc()
        return
    out.probe["lastError"] = None
    out.events.append(Event("Normal", "GoodputMeasured", out.goodput["summary"]))
    metrics.PROBES.labels("succeeded").inc()


async def _probe_step(
    deps: Deps, t: Target, owner: render.Owner, spec: api.PDDeploymentSpec, phase: str | None
) -> ProbeOutcome:
    out = ProbeOutcome(probe=dict(t.status.get("probe") or {}))
    running = await _collect_finished(deps, t, spec, out)
    inputs = goodput.ProbeInputs(
        spec=spec,
        phase=phase,
        probe=out.probe,
        annotations=t.annotations,
        has_result=bool(out.goodput or t.status.get("goodput")),
        running_jobs=len(running),
        now=deps.now(),
    )
    trigger = goodput.due(inputs)
    if trigger is None:
        return out
    name = goodput.job_name(t.name, inputs.now)
    try:
        await deps.kube.create(render.probe_job(owner, spec, name))
    except KubeError as exc:
        metrics.RECONCILE_ERRORS.labels("probe").inc()
        log.warning("%s/%s: cannot create probe Job: %s", t.namespace, t.name, exc)
        return out
    out.probe.update(jobName=name, trigger=trigger, startedAt=goodput.rfc3339(inputs.now))
    if trigger == "annotation":
        out.probe["lastAnnotation"] = t.annotations.get(api.RUN_PROBE_ANNOTATION)
    out.events.append(Event("Normal", "GoodputProbeStarted", f"probe Job {name} ({trigger})"))
    metrics.PROBES.labels("started").inc()
    return out


def _changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """Only the fields that differ, so that a steady state writes nothing."""
    return {k: v for k, v in new.items() if previous.get(k) != v}


async def reconcile(t: Target, deps: Deps) -> Result:
    """Bring the children of one PDDeployment in line with its spec and compute its status."""
    now = goodput.rfc3339(deps.now())
    previous = dict(t.status)
    try:
        spec = validate_spec(t.spec)
    except SpecError as exc:
        snap = Snapshot(generation=t.generation, now=now, spec=None, spec_problems=exc.problems, previous=previous)
        new = observe.status(snap)
        return Result(_changes(previous, new), observe.events(previous, new))
    owner = render.Owner(name=t.name, namespace=t.namespace, uid=t.uid, generation=t.generation)
    if t.check_children:
        await _ensure_children(deps.kube, owner, spec)
    serving = next((p for p in t.pods if _component(p) == render.COMPONENT_SERVING), None)
    pod = await _converge_pod(deps.kube, owner, spec, serving)
    snap = Snapshot(
        generation=t.generation,
        now=now,
        spec=spec,
        pod=pod.pod,
        pod_current=pod.current,
        pod_error=pod.error,
        proxy=await _poll_proxy(deps, spec, pod.pod, previous),
        previous=previous,
    )
    new = observe.status(snap)
    probe = await _probe_step(deps, t, owner, spec, new["phase"])
    if probe.goodput is not None:
        new = observe.status(dataclasses.replace(snap, goodput=probe.goodput))
        new["goodput"] = probe.goodput
    new["probe"] = probe.probe
    events = pod.events + probe.events + observe.events(previous, new)
    return Result(_changes(previous, new), events)


# ---- kopf wiring ---------------------------------------------------------------------------------------------

_deps: list[Deps] = []


def install(deps: Deps) -> None:
    """Use these connections instead of the ones made at startup (tests, embedding)."""
    _deps[:] = [deps]


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # Events come from observe.events, not from every log line
    if not _deps:
        install(Deps(kube=Kube.from_environment(), fetch_proxy_status=fetch_proxy_status))


def _plain(body: Mapping[str, Any]) -> Obj:
    """The parts of a watched object the operator reads, as plain data."""
    return {
        "metadata": dict(body.get("metadata") or {}),
        "spec": {"nodeName": (body.get("spec") or {}).get("nodeName")},
        "status": dict(body.get("status") or {}),
    }


def _index_entry(kwargs: Mapping[str, Any]) -> dict[Any, Obj] | None:
    owner = kwargs["labels"].get(render.LABEL_DEPLOYMENT)
    return {(kwargs["namespace"], owner): _plain(kwargs["body"])} if owner else None


@kopf.index("pods", labels=MANAGED_BY)
def pd_pods(**kwargs: Any) -> dict[Any, Obj] | None:
    """Serving and probe pods by (namespace, PDDeployment name), kept current by a watch."""
    return _index_entry(kwargs)


@kopf.index("batch", "v1", "jobs", labels=MANAGED_BY)
def pd_jobs(**kwargs: Any) -> dict[Any, Obj] | None:
    """Probe Jobs by (namespace, PDDeployment name)."""
    return _index_entry(kwargs)


async def _handle(trigger: str, kwargs: Mapping[str, Any]) -> None:
    body: kopf.Body = kwargs["body"]
    patch: kopf.Patch = kwargs["patch"]
    meta = body.metadata
    namespace, name = str(meta.namespace), str(meta.name)
    key = (namespace, name)
    target = Target(
        name=name,
        namespace=namespace,
        uid=str(meta.uid),
        generation=int(meta.get("generation") or 0),
        spec=dict(body.spec),
        status=dict(body.status),
        annotations=dict(meta.annotations),
        pods=list(kwargs["pd_pods"].get(key, [])),
        jobs=list(kwargs["pd_jobs"].get(key, [])),
    )
    memo = kwargs["memo"]
    due = trigger != "timer" or time.monotonic() - memo.get("children_checked", -math.inf) > CHILDREN_RESYNC_SECONDS
    if due:
        memo["children_checked"] = time.monotonic()
    target = dataclasses.replace(target, check_children=due)
    lock: asyncio.Lock = memo.setdefault("lock", asyncio.Lock())
    async with lock:
        with metrics.RECONCILE_SECONDS.labels(trigger).time():
            result = await reconcile(target, _deps[0])
    patch.status.update(result.status)
    metrics.set_phase(namespace, name, result.status.get("phase", target.status.get("phase")))
    metrics.RECONCILES.labels(trigger, "changed" if result.status else "unchanged").inc()
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
async def on_change(**kwargs: Any) -> None:
    await _handle(str(kwargs["reason"]), kwargs)


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(**kwargs: Any) -> None:
    await _handle("timer", kwargs)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def on_delete(**kwargs: Any) -> None:
    """Children go with the owner (garbage collection via owner references); only forget the metrics."""
    namespace, name = str(kwargs["namespace"]), str(kwargs["name"])
    metrics.forget(namespace, name)
    log.info("%s/%s deleted; its children follow through owner references", namespace, name)
