"""goodput.py: summary parsing, status.goodput, and when probes run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pd_operator import goodput, layout
from pd_operator.api import RUN_PROBE_ANNOTATION, ProbeState
from pd_operator.validation import validate_spec
from pd_operator.views import job_view, pod_view
from tests.operator.podfacts import finished_job, summary

SPEC = validate_spec({"model": "m", "engine": "simulated", "goodputProbe": {"enabled": True, "intervalSeconds": 600}})
NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def status_goodput(doc: dict[str, Any], generation: int) -> dict[str, Any]:
    lay = layout.build(layout.Owner("demo", generation=generation), SPEC)
    return goodput.goodput_status(doc, SPEC, lay).model_dump(by_alias=True, exclude_none=True)


def test_summary_becomes_status_goodput() -> None:
    out = status_goodput(summary(0.73), generation=4)
    assert (out["requests"], out["good"], out["attainment"], out["met"]) == (100, 73, 0.73, False)
    assert out["ttftMs"] == {"p50": 300.0, "p90": 800.0, "p99": 1500.0, "mean": 400.0}
    assert out["slo"] == {"ttftMs": 1000.0, "itlMs": 50.0, "target": 0.9}
    assert out["measured"] == {
        "mode": "disaggregated",
        "transferMode": "write",
        "engine": "simulated",
        "gpuSplit": "prefill 0-3 TP4, decode 4-7 TP4",
        "generation": 4,
    }
    assert out["summary"] == "73% @8/s" and out["attainmentLow"] == pytest.approx(0.64)


def test_search_result_and_missing_percentiles() -> None:
    doc = summary(0.95) | {"goodput_rate": 9.5, "itl_ms": {"p50": None, "p90": None, "p99": None, "mean": None}}
    out = status_goodput(doc, 1)
    assert out["goodputRate"] == 9.5 and out["itlMs"] == {} and out["met"] is True
    assert out["summary"] == "95% @8/s (max 9.5/s)"


@pytest.mark.parametrize(
    "text", ["not json", "[]", json.dumps({"schema": "other"}), json.dumps({"schema": goodput.SUMMARY_SCHEMA})]
)
def test_bad_summaries_are_errors(text: str) -> None:
    with pytest.raises(goodput.SummaryError):
        goodput.parse_summary(text)


def test_summary_fits_a_termination_message() -> None:
    assert len(json.dumps(summary()).encode()) < 4096


def inputs(**kw: Any) -> goodput.ProbeInputs:
    base: dict[str, Any] = dict(
        spec=SPEC, phase="Ready", probe={}, annotations={}, has_result=False, running_jobs=0, now=NOW
    )
    merged = base | kw
    merged["probe"] = ProbeState.model_validate(merged["probe"])
    return goodput.ProbeInputs(**merged)


def test_first_probe_once_ready_then_every_interval() -> None:
    assert goodput.due(inputs()) == "ready"
    assert goodput.due(inputs(phase="Progressing")) is None
    recent = {"lastFinishedAt": goodput.rfc3339(NOW - timedelta(seconds=60))}
    assert goodput.due(inputs(probe=recent, has_result=True)) is None
    old = {"lastFinishedAt": goodput.rfc3339(NOW - timedelta(seconds=600))}
    assert goodput.due(inputs(probe=old, has_result=True)) == "interval"


def test_probes_never_overlap_and_honour_the_annotation_once() -> None:
    assert goodput.due(inputs(running_jobs=1)) is None
    asked = {RUN_PROBE_ANNOTATION: "2026-11-29T09:00"}
    recent = {"lastFinishedAt": goodput.rfc3339(NOW), "lastAnnotation": None}
    assert goodput.due(inputs(probe=recent, annotations=asked, has_result=True)) == "annotation"
    done = recent | {"lastAnnotation": "2026-11-29T09:00"}
    assert goodput.due(inputs(probe=done, annotations=asked, has_result=True)) is None
    assert goodput.due(inputs(spec=validate_spec({"model": "m", "engine": "simulated"}))) is None


def test_job_names_are_valid_label_values() -> None:
    name = goodput.job_name("x" * 80, NOW)
    assert len(name) <= 63 and name.endswith("-goodput-20261129080000")


def test_job_failure_reason() -> None:
    job = {
        "status": {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ],
        }
    }
    assert job_view(job).finished
    assert job_view(job).failure.startswith("DeadlineExceeded")
    assert not job_view({"status": {"active": 1}}).finished


def test_termination_message_from_the_newest_probe_pod() -> None:
    job = {"metadata": {"name": "demo-goodput-1"}, "spec": {"template": {"metadata": {"labels": {}}}}}
    _, old = finished_job(job, "old")
    _, new = finished_job(job, "new")
    new["metadata"]["creationTimestamp"] = "2026-11-29T09:00:00Z"
    assert goodput.termination_message([pod_view(old), pod_view(new)]) == "new"
    assert goodput.termination_message([]) is None
