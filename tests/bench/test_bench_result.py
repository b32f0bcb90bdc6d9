"""The JSON documents: schema validation, the contract-4 summary keys, the 4 KiB limit, the table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pd_runtime.bench.plan import Mode, RunResult, Workload
from pd_runtime.bench.report import render_table
from pd_runtime.bench.result import SUMMARY_LIMIT_BYTES, RunContext, full_result, summary, summary_json
from pd_runtime.bench.search import Bracket
from pd_runtime.bench.slo import RequestTiming, Slo
from pd_runtime.bench.stage import summarize_stage
from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.arrivals import Arrival

SLO = Slo(ttft_ms=1000, itl_ms=50, target=0.9)
CONTEXT = RunContext(url="http://127.0.0.1:1/v1/completions", timeout_s=300, label=None, client="aiohttp x")
CONTRACT_KEYS = {
    "schema",
    "time",
    "model",
    "rate",
    "requests",
    "good",
    "errors",
    "attainment",
    "attainment_ci",
    "ttft_ms",
    "itl_ms",
    "slo",
    "goodput_rate",
    "duration_s",
}


def workload(model: str = "Qwen/Qwen3-235B-A22B-FP8") -> Workload:
    return Workload(
        model=model,
        endpoint=Endpoint.COMPLETIONS,
        requests=100,
        warmup=0,
        prompt_tokens=2000,
        output_tokens=1000,
        arrival=Arrival.POISSON,
        seed=0,
        slo=SLO,
    )


def timings(count: int, slow_every: int = 4) -> list[RequestTiming]:
    result = []
    for i in range(count):
        ttft = 1.5 if i % slow_every == 0 else 0.3
        error = "http_500: injected" if i == 1 else None
        result.append(
            RequestTiming(
                index=i,
                request_id=f"run-{i}",
                warmup=False,
                scheduled_s=i / 8,
                sent_s=i / 8 + 0.0005,
                end_s=i / 8 + 40,
                first_token_s=i / 8 + ttft,
                last_token_s=i / 8 + ttft + 0.038 * 999,
                completion_tokens=1000,
                prompt_tokens=2000,
                error=error,
            )
        )
    return result


def run_result(mode: Mode, rates: list[float], model_workload: Workload | None = None) -> RunResult:
    wl = model_workload or workload()
    stages = tuple(summarize_stage(r, timings(100, slow_every=2 + i), wl.slo, 1000) for i, r in enumerate(rates))
    return RunResult(
        mode=mode,
        started=datetime(2026, 11, 29, 8, 0, tzinfo=UTC),
        duration_s=51.2,
        stages=stages,
        headline=0,
        bracket=None if mode is Mode.RATE else Bracket(passing=rates[0], failing=rates[-1]),
    )


def test_summary_has_exactly_the_contract_keys(validators: dict[str, Draft202012Validator]) -> None:
    document = summary(run_result(Mode.RATE, [8.0]), workload())
    assert set(document) == CONTRACT_KEYS
    assert document["schema"] == "pd.serving.dev/bench-summary/v1"
    assert document["time"] == "2026-11-29T08:00:00Z"
    assert set(document["ttft_ms"]) == set(document["itl_ms"]) == {"p50", "p90", "p99", "mean"}
    assert document["slo"] == {"ttft_ms": 1000, "itl_ms": 50, "target": 0.9}
    assert document["requests"] == 100 and document["errors"] == 1
    assert 0 <= document["attainment"] <= 1
    assert document["goodput_rate"] is None
    validators["summary"].validate(document)


def test_summary_fits_a_termination_message_even_with_a_huge_model_name(
    validators: dict[str, Draft202012Validator],
) -> None:
    long_model = workload(model="x" * 10_000)
    text = summary_json(run_result(Mode.SEARCH, [1234567.891, 2469135.782], long_model), long_model)
    assert len(text.encode()) < SUMMARY_LIMIT_BYTES
    assert "\n" not in text
    validators["summary"].validate(json.loads(text))


def test_full_result_validates_and_repeats_the_summary(validators: dict[str, Draft202012Validator]) -> None:
    run = run_result(Mode.SWEEP, [1.0, 2.0, 3.0])
    document = full_result(run, workload(), CONTEXT)
    validators["result"].validate(document)
    short = summary(run, workload())
    assert {k: document[k] for k in CONTRACT_KEYS - {"schema"}} == {k: short[k] for k in CONTRACT_KEYS - {"schema"}}
    assert document["schema"] == "pd.serving.dev/bench-result/v1"
    assert len(document["stages"]) == 3 and len(document["records"]) == 100
    assert document["search"] == {"passing_rate": 1.0, "failing_rate": 3.0}
    assert document["goodput_rate"] == 1.0


def test_schema_rejects_a_broken_summary(validators: dict[str, Draft202012Validator]) -> None:
    document: dict[str, Any] = summary(run_result(Mode.RATE, [8.0]), workload())
    for broken in ({**document, "attainment": 73}, {**document, "extra": 1}, {**document, "ttft_ms": {}}):
        assert not validators["summary"].is_valid(broken)


def test_empty_stage_document_is_valid(validators: dict[str, Draft202012Validator]) -> None:
    stage = summarize_stage(1.0, [], SLO, 1000)
    run = RunResult(Mode.RATE, datetime(2026, 1, 1, tzinfo=UTC), 0.0, (stage,), 0, None)
    validators["result"].validate(full_result(run, workload(), CONTEXT))


@pytest.mark.parametrize("mode", [Mode.RATE, Mode.SWEEP, Mode.SEARCH])
def test_table_mentions_the_figures(mode: Mode) -> None:
    run = run_result(mode, [8.0, 16.0])
    table = render_table(run, workload())
    stage = run.stages[0]
    assert f"{100 * stage.attainment:.1f}" in table
    assert "TTFT" in table and "ITL" in table
    if mode is not Mode.RATE:
        assert "goodput" in table
