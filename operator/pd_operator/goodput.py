"""Pure: when to run a goodput probe, and what its summary means for status.goodput.

A probe is a Job running ``pdctl bench ... --result-file /dev/termination-log``; the kubelet copies that
file (at most 4 KiB) into the pod's termination message, which is where the operator reads the summary
(schema ``pd.serving.dev/bench-summary/v1``). Probes never overlap (at most one Job per deployment) and
start only while the deployment is Ready: first once it becomes Ready, then every interval, on demand
when the user sets or changes the ``pd.serving.dev/run-goodput-probe`` annotation, and for each
autotuning trial (before any other reason: a trial's layout is in force only to be measured).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pd_operator.api import (
    RUN_PROBE_ANNOTATION,
    GoodputStatus,
    LatencyStats,
    PDDeploymentSpec,
    ProbeMeasured,
    ProbeSlo,
    ProbeState,
)
from pd_operator.layout import Layout
from pd_operator.render import BENCH_CONTAINER
from pd_operator.views import PodView

SUMMARY_SCHEMA = "pd.serving.dev/bench-summary/v1"
Obj = dict[str, Any]
Trigger = Literal["ready", "interval", "annotation", "autotune"]


class SummaryError(ValueError):
    """The termination message is not a usable bench summary."""


# ---- timestamps ---------------------------------------------------------------------------------------


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


JOB_PREFIX_LENGTH = 40  # of the deployment's name in a probe Job's: the Job name is a label value too


def job_name(deployment: str, now: datetime) -> str:
    """Unique per second, short enough for the job-name label (63 characters)."""
    return f"{deployment[:JOB_PREFIX_LENGTH]}-goodput-{now.astimezone(UTC):%Y%m%d%H%M%S}"


# ---- jobs -------------------------------------------------------------------------------------------------


def termination_message(pods: Sequence[PodView]) -> str | None:
    """The bench container's termination message, from the newest pod that has one."""
    for pod in sorted(pods, key=lambda p: p.created, reverse=True):
        bench = pod.container(BENCH_CONTAINER)
        if bench is not None and bench.terminated_message:
            return bench.terminated_message
    return None


# ---- summary -> status.goodput -------------------------------------------------------------------------------


def parse_summary(text: str) -> Obj:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SummaryError(f"termination message is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SUMMARY_SCHEMA:
        raise SummaryError(f"termination message is not a {SUMMARY_SCHEMA} document")
    missing = [
        k
        for k in ("time", "rate", "requests", "good", "errors", "attainment", "ttft_ms", "itl_ms", "slo")
        if k not in doc
    ]
    if missing:
        raise SummaryError("summary lacks " + ", ".join(missing))
    return doc


def _latency(stats: Mapping[str, Any]) -> LatencyStats:
    return LatencyStats(**{k: float(stats[k]) for k in ("p50", "p90", "p99", "mean") if stats.get(k) is not None})


def gpu_split(layout: Layout) -> str:
    return ", ".join(f"{e.name} {e.gpu_range} TP{e.tensor_parallel_size}" for e in layout.engines)


def goodput_status(summary: Mapping[str, Any], spec: PDDeploymentSpec, layout: Layout) -> GoodputStatus:
    """status.goodput from a bench summary and the spec (and its layout) it measured."""
    slo = summary["slo"]
    attainment, target, rate = float(summary["attainment"]), float(slo["target"]), float(summary["rate"])
    interval = summary.get("attainment_ci")
    low, high = (
        (float(interval[0]), float(interval[1])) if isinstance(interval, list) and len(interval) == 2 else (None, None)
    )
    search = float(summary["goodput_rate"]) if summary.get("goodput_rate") is not None else None
    return GoodputStatus(
        time=str(summary["time"]),
        rate=rate,
        requests=int(summary["requests"]),
        good=int(summary["good"]),
        errors=int(summary["errors"]),
        attainment=attainment,
        attainment_low=low,
        attainment_high=high,
        ttft_ms=_latency(summary["ttft_ms"]),
        itl_ms=_latency(summary["itl_ms"]),
        goodput_rate=search,
        slo=ProbeSlo(ttft_ms=float(slo["ttft_ms"]), itl_ms=float(slo["itl_ms"]), target=target),
        met=attainment >= target,
        measured=ProbeMeasured(
            mode=spec.mode,
            transfer_mode=spec.transfer_in_effect,
            engine=spec.engine,
            gpu_split=gpu_split(layout),
            generation=layout.owner.generation,
        ),
        summary=f"{attainment:.0%} @{rate:g}/s" + (f" (max {search:g}/s)" if search is not None else ""),
    )


# ---- scheduling ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeInputs:
    spec: PDDeploymentSpec
    phase: str | None
    probe: ProbeState
    annotations: Mapping[str, str]
    has_result: bool
    running_jobs: int
    now: datetime
    autotune: bool = False  # an autotuning trial waits for its measurement


def due(inputs: ProbeInputs) -> Trigger | None:
    """Why a probe should start now, or None. Never while one runs or while not Ready."""
    if not inputs.spec.goodput_probe.enabled or inputs.running_jobs or inputs.phase != "Ready":
        return None
    if inputs.autotune:
        return "autotune"
    requested = inputs.annotations.get(RUN_PROBE_ANNOTATION)
    if requested is not None and requested != inputs.probe.last_annotation:
        return "annotation"
    last = parse_time(inputs.probe.last_finished_at)
    if last is None:
        return None if inputs.has_result else "ready"
    if (inputs.now - last).total_seconds() >= inputs.spec.goodput_probe.interval_seconds:
        return "interval"
    return None
