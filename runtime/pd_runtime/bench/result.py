"""Pure: the JSON documents a run produces.

Two documents share their top-level figures (those of the headline stage, measured at --rate):
- the summary (``--result-file``): compact, always under 4 KiB, read by the operator from the probe
  Job's termination message (schema ``pd.serving.dev/bench-summary/v1``, summary.schema.json);
- the full result (``--output``): the same keys plus mode, configuration, every stage and per-request
  records (schema ``pd.serving.dev/bench-result/v1``, result.schema.json).
Both are documented in docs/goodput.md; keys are only ever added, never renamed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pd_runtime.bench.plan import RunResult, Workload
from pd_runtime.bench.slo import RequestOutcome
from pd_runtime.bench.stage import StageResult

SUMMARY_SCHEMA = "pd.serving.dev/bench-summary/v1"
RESULT_SCHEMA = "pd.serving.dev/bench-result/v1"
SUMMARY_LIMIT_BYTES = 4096
MAX_MODEL_CHARS = 256
"""The summary must fit a termination message whatever the model name is."""


@dataclass(frozen=True)
class RunContext:
    """What the documents record about how the run was made (not needed to compute figures)."""

    url: str
    timeout_s: float
    label: str | None
    client: str


def summary(run: RunResult, workload: Workload) -> dict[str, Any]:
    stage = run.stages[run.headline]
    slo = workload.slo
    return {
        "schema": SUMMARY_SCHEMA,
        "time": run.started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "model": workload.model[:MAX_MODEL_CHARS],
        "rate": stage.rate,
        "requests": stage.requests,
        "good": stage.good,
        "errors": stage.errors,
        "attainment": round(stage.attainment, 6),
        "attainment_ci": [round(bound, 4) for bound in stage.attainment_ci],
        "ttft_ms": stage.ttft_ms.as_dict(),
        "itl_ms": stage.itl_ms.as_dict(),
        "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms, "target": slo.target},
        "goodput_rate": run.bracket.passing if run.bracket is not None else None,
        "duration_s": round(run.duration_s, 3),
    }


def summary_json(run: RunResult, workload: Workload) -> str:
    text = json.dumps(summary(run, workload), separators=(",", ":"))
    if len(text.encode()) > SUMMARY_LIMIT_BYTES:
        raise ValueError(f"summary is {len(text.encode())} bytes, over the {SUMMARY_LIMIT_BYTES}-byte limit")
    return text


def full_result(run: RunResult, workload: Workload, context: RunContext) -> dict[str, Any]:
    headline = run.stages[run.headline]
    return {
        **summary(run, workload),
        "schema": RESULT_SCHEMA,
        "model": workload.model,
        "mode": run.mode.value,
        "config": {
            "url": context.url,
            "endpoint": workload.endpoint.value,
            "label": context.label,
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
            "ignore_eos": workload.ignore_eos,
            "warmup": workload.warmup,
            "arrival": workload.arrival.value,
            "seed": workload.seed,
            "timeout_s": context.timeout_s,
            "client": context.client,
        },
        "search": None
        if run.bracket is None
        else {"passing_rate": run.bracket.passing, "failing_rate": run.bracket.failing},
        "headline_stage": run.headline,
        "stages": [stage_document(stage) for stage in run.stages],
        "records": [record_document(r) for r in headline.records],
    }


def stage_document(stage: StageResult) -> dict[str, Any]:
    return {
        "rate": stage.rate,
        "achieved_rate": None if stage.achieved_rate is None else round(stage.achieved_rate, 4),
        "requests": stage.requests,
        "good": stage.good,
        "errors": stage.errors,
        "error_kinds": stage.error_kinds,
        "short_replies": stage.short_replies,
        "attainment": round(stage.attainment, 6),
        "attainment_ci": [round(bound, 4) for bound in stage.attainment_ci],
        "ttft_ms": stage.ttft_ms.as_dict(),
        "itl_ms": stage.itl_ms.as_dict(),
        "e2e_ms": stage.e2e_ms.as_dict(),
        "send_lag_ms": stage.send_lag_ms.as_dict(),
        "duration_s": round(stage.duration_s, 3),
        "records": [record_document(r) for r in stage.records],
    }


def record_document(outcome: RequestOutcome) -> dict[str, Any]:
    return {
        "index": outcome.index,
        "id": outcome.request_id,
        "sent_s": round(outcome.sent_s, 6),
        "lag_ms": round(outcome.lag_ms, 3),
        "ttft_ms": _round(outcome.ttft_ms),
        "itl_ms": _round(outcome.itl_ms),
        "e2e_ms": round(outcome.e2e_ms, 3),
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "good": outcome.good,
        "error": outcome.error,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
