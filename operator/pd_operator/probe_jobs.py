"""Pure: the goodput probe's Jobs in one reconcile. Finished Jobs are collected (their bench summary recorded
into ``status.goodput``, or the failure into ``status.probe.lastError``) and deleted with their pods; a new
Job is started when one is due (``goodput.due``: the interval, the annotation, a spec change, an autotune trial).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pd_operator import goodput, render
from pd_operator.actions import Action, Create, Delete, Emit
from pd_operator.api import RUN_PROBE_ANNOTATION, GoodputStatus, PDDeploymentSpec, ProbeState
from pd_operator.layout import Layout
from pd_operator.observe import Event
from pd_operator.ownership import controlled_by, probe_jobs
from pd_operator.snapshot import Snapshot
from pd_operator.views import JobView, PodView

Obj = dict[str, Any]
ERROR_LIMIT = 1024


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


def collect_probes(snap: Snapshot, spec: PDDeploymentSpec, lay: Layout, previous: ProbeState) -> tuple[ProbeStep, int]:
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


def start_probe(snap: Snapshot, spec: PDDeploymentSpec, lay: Layout, step: ProbeStep, ctx: ProbeContext) -> ProbeStep:
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
