"""Pure: when to run a goodput probe, and what its summary means for status.goodput.

A probe is a Job running ``pdctl bench ... --result-file /dev/termination-log``; the kubelet copies that
file (at most 4 KiB) into the pod's termination message, which is where the operator reads the summary
(schema ``pd.serving.dev/bench-summary/v1``). Probes never overlap (at most one Job per deployment) and
start only while the deployment is Ready: first once it becomes Ready, then every interval, and on demand
when the user sets or changes the ``pd.serving.dev/run-goodput-probe`` annotation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pd_operator.api import RUN_PROBE_ANNOTATION, PDDeploymentSpec
from pd_operator.engine_cmd import engine_containers
from pd_operator.render import BENCH_CONTAINER

SUMMARY_SCHEMA = "pd.serving.dev/bench-summary/v1"
Obj = dict[str, Any]
Trigger = Literal["ready", "interval", "annotation"]


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


def job_name(deployment: str, now: datetime) -> str:
    """Unique per second, short enough for the job-name label (63 characters)."""
    return f"{deployment[:40]}-goodput-{now.astimezone(UTC):%Y%m%d%H%M%S}"


# ---- jobs -------------------------------------------------------------------------------------------------


def job_finished(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    if status.get("succeeded") or status.get("failed"):
        return True
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in status.get("conditions") or []
    )


def termination_message(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The bench container's termination message, from the newest pod that has one."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == BENCH_CONTAINER and terminated.get("message"):
                return str(terminated["message"])
    return None


def job_failure(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".strip()
    return "the probe Job ended without a summary"


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


def _latency(stats: Mapping[str, Any]) -> Obj:
    return {k: float(stats[k]) for k in ("p50", "p90", "p99", "mean") if stats.get(k) is not None}


def gpu_split(spec: PDDeploymentSpec) -> str:
    parts = [f"{e.name} {e.settings.gpus} TP{e.settings.tensor_parallel_size}" for e in engine_containers(spec)]
    return ", ".join(parts)


def goodput_status(summary: Mapping[str, Any], spec: PDDeploymentSpec, generation: int) -> Obj:
    """status.goodput from a bench summary and the spec it measured."""
    slo = summary["slo"]
    attainment, target = float(summary["attainment"]), float(slo["target"])
    out: Obj = {
        "time": str(summary["time"]),
        "rate": float(summary["rate"]),
        "requests": int(summary["requests"]),
        "good": int(summary["good"]),
        "errors": int(summary["errors"]),
        "attainment": attainment,
        "ttftMs": _latency(summary["ttft_ms"]),
        "itlMs": _latency(summary["itl_ms"]),
        "slo": {"ttftMs": float(slo["ttft_ms"]), "itlMs": float(slo["itl_ms"]), "target": target},
        "met": attainment >= target,
        "measured": {
            "mode": spec.mode,
            "transferMode": spec.kv_transfer.transfer_mode if spec.mode == "disaggregated" else "none",
            "engine": spec.engine,
            "gpuSplit": gpu_split(spec),
            "generation": generation,
        },
        "summary": f"{attainment:.0%} @{float(summary['rate']):g}/s",
    }
    interval = summary.get("attainment_ci")
    if isinstance(interval, list) and len(interval) == 2:
        out["attainmentLow"], out["attainmentHigh"] = float(interval[0]), float(interval[1])
    if summary.get("goodput_rate") is not None:
        out["goodputRate"] = float(summary["goodput_rate"])
        out["summary"] += f" (max {float(summary['goodput_rate']):g}/s)"
    return out


# ---- scheduling ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeInputs:
    spec: PDDeploymentSpec
    phase: str | None
    probe: Mapping[str, Any]  # status.probe
    annotations: Mapping[str, str]
    has_result: bool
    running_jobs: int
    now: datetime


def due(inputs: ProbeInputs) -> Trigger | None:
    """Why a probe should start now, or None. Never while one runs or while not Ready."""
    if not inputs.spec.goodput_probe.enabled or inputs.running_jobs or inputs.phase != "Ready":
        return None
    requested = inputs.annotations.get(RUN_PROBE_ANNOTATION)
    if requested is not None and requested != inputs.probe.get("lastAnnotation"):
        return "annotation"
    last = parse_time(inputs.probe.get("lastFinishedAt"))
    if last is None:
        return None if inputs.has_result else "ready"
    if (inputs.now - last).total_seconds() >= inputs.spec.goodput_probe.interval_seconds:
        return "interval"
    return None
