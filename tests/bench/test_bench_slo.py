"""Per-request rules: ITL, the one-token rule, failures, inclusive SLO bounds, stage figures."""

from __future__ import annotations

import json

import pytest

from pd_runtime.bench.plan import Workload, plan_stage
from pd_runtime.bench.slo import NO_TOKENS, SHORT_REPLY, RequestTiming, Slo, judge, request_itl_s
from pd_runtime.bench.stage import error_kind, summarize_stage
from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.arrivals import Arrival

SLO = Slo(ttft_ms=1000, itl_ms=50, target=0.9)


def timing(
    first: float | None = 0.5,
    last: float | None = 5.5,
    tokens: int = 101,
    error: str | None = None,
    index: int = 0,
    warmup: bool = False,
) -> RequestTiming:
    return RequestTiming(
        index=index,
        request_id=f"r{index}",
        warmup=warmup,
        scheduled_s=0.0,
        sent_s=0.0,
        end_s=6.0,
        first_token_s=first,
        last_token_s=last,
        completion_tokens=tokens,
        error=error,
    )


def test_itl_is_span_over_tokens_minus_one() -> None:
    assert request_itl_s(timing(first=1.0, last=2.0, tokens=11)) == pytest.approx(0.1)


def test_itl_uses_token_count_not_chunk_count() -> None:
    """Ten tokens in two chunks 90 ms apart: the gaps between tokens average 10 ms, not 90 ms."""
    assert request_itl_s(timing(first=1.0, last=1.09, tokens=10)) == pytest.approx(0.01)


def test_itl_undefined_for_one_token() -> None:
    assert request_itl_s(timing(first=1.0, last=1.0, tokens=1)) is None


def test_good_request_meets_both_slos_inclusively() -> None:
    outcome = judge(timing(first=1.0, last=1.0 + 0.05 * 100, tokens=101), SLO, output_tokens=101)
    assert outcome.ttft_ms == pytest.approx(1000)
    assert outcome.itl_ms == pytest.approx(50)
    assert outcome.good and outcome.error is None


def test_slow_first_token_or_slow_decode_fails() -> None:
    assert not judge(timing(first=1.001), SLO, 101).good
    assert not judge(timing(first=0.1, last=0.1 + 0.051 * 100), SLO, 101).good


def test_one_token_reply_to_one_token_request_is_judged_on_ttft_alone() -> None:
    fast = judge(timing(first=0.2, last=0.2, tokens=1), SLO, output_tokens=1)
    slow = judge(timing(first=1.2, last=1.2, tokens=1), SLO, output_tokens=1)
    assert fast.good and fast.itl_ms is None and fast.error is None
    assert not slow.good and slow.error is None


def test_one_token_reply_to_longer_request_fails_as_short_reply() -> None:
    outcome = judge(timing(first=0.2, last=0.2, tokens=1), SLO, output_tokens=100)
    assert not outcome.good
    assert outcome.error == SHORT_REPLY
    assert outcome.short


def test_reply_without_tokens_fails() -> None:
    outcome = judge(timing(first=None, last=None, tokens=0), SLO, output_tokens=10)
    assert not outcome.good and outcome.error == NO_TOKENS


def test_errors_fail_and_carry_no_latency() -> None:
    outcome = judge(timing(error="timeout: no complete reply within 1 s"), SLO, 101)
    assert not outcome.good
    assert outcome.ttft_ms is None and outcome.itl_ms is None


def test_stage_counts_errors_as_failures_and_excludes_warmup() -> None:
    timings = [
        timing(index=-1, warmup=True, error="http_500: boom"),
        timing(index=0),
        timing(index=1, error="http_500: boom"),
        timing(index=2, error="timeout: x"),
        timing(index=3, first=2.0),
    ]
    stage = summarize_stage(8.0, timings, SLO, output_tokens=101)
    assert stage.requests == 4
    assert stage.good == 1
    assert stage.errors == 2
    assert stage.attainment == pytest.approx(0.25)
    assert stage.error_kinds == {"http_500": 1, "timeout": 1}
    assert stage.ttft_ms.p50 == pytest.approx(1250)  # the two successful requests: 500 and 2000 ms
    assert [r.index for r in stage.records] == [0, 1, 2, 3]


def test_empty_stage() -> None:
    stage = summarize_stage(1.0, [], SLO, output_tokens=10)
    assert stage.requests == 0 and stage.attainment == 0.0 and stage.attainment_ci == (0.0, 1.0)
    assert stage.ttft_ms.p50 is None


def test_error_kind() -> None:
    assert error_kind("http_503: overloaded: try later") == "http_503"
    assert error_kind("weird") == "weird"


def test_natural_replies_judge_a_one_token_reply_on_ttft_alone() -> None:
    """With --no-ignore-eos a reply may end at EOS after one token: that is legitimate, not short."""
    natural = Workload("m", Endpoint.COMPLETIONS, 1, 0, 10, 100, Arrival.CONSTANT, 0, SLO, ignore_eos=False)
    exact = Workload("m", Endpoint.COMPLETIONS, 1, 0, 10, 100, Arrival.CONSTANT, 0, SLO)
    one_token = RequestTiming(0, "r", False, 0.0, 0.0, 0.2, first_token_s=0.1, last_token_s=0.1, completion_tokens=1)
    assert judge(one_token, SLO, natural.exact_tokens).good
    assert not judge(one_token, SLO, exact.exact_tokens).good
    assert json.loads(plan_stage(natural, 1.0, "run")[0].body)["ignore_eos"] is False
    assert json.loads(plan_stage(exact, 1.0, "run")[0].body)["ignore_eos"] is True
