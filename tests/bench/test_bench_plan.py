"""Arrivals, prompts of exact length, request bodies, endpoint URLs, stage plans."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest

from pd_runtime.bench.arrivals import Arrival, arrival_offsets, stage_rng
from pd_runtime.bench.payload import Endpoint, endpoint_url, request_body
from pd_runtime.bench.plan import Workload, headline_index, plan_stage
from pd_runtime.bench.slo import Slo

WORKLOAD = Workload(
    model="m",
    endpoint=Endpoint.COMPLETIONS,
    requests=20,
    warmup=3,
    prompt_tokens=2000,
    output_tokens=1000,
    arrival=Arrival.POISSON,
    seed=0,
    slo=Slo(1000, 50, 0.9),
)


def test_constant_arrivals_are_evenly_spaced() -> None:
    assert arrival_offsets(4, 8.0, Arrival.CONSTANT, random.Random(0)) == [0.0, 0.125, 0.25, 0.375]


def test_poisson_gaps_have_mean_one_over_rate() -> None:
    offsets = arrival_offsets(20001, 8.0, Arrival.POISSON, random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(1 / 8, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 8, rel=0.05)  # exponential: sd = mean


def test_arrivals_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0, Arrival.POISSON, random.Random(0))


def test_same_seed_and_rate_give_same_arrivals() -> None:
    first = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(5, 2.0, "arrivals"))
    again = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(5, 2.0, "arrivals"))
    other = arrival_offsets(10, 2.0, Arrival.POISSON, stage_rng(6, 2.0, "arrivals"))
    assert first == again != other


@pytest.mark.parametrize(
    ("base", "endpoint", "expected"),
    [
        ("http://h:8000", Endpoint.COMPLETIONS, "http://h:8000/v1/completions"),
        ("http://h:8000/", Endpoint.CHAT, "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1", Endpoint.COMPLETIONS, "http://h:8000/v1/completions"),
        ("http://h/v1/completions", Endpoint.COMPLETIONS, "http://h/v1/completions"),
        ("http://h/api/v1/chat/completions/", Endpoint.CHAT, "http://h/api/v1/chat/completions"),
    ],
)
def test_endpoint_url(base: str, endpoint: Endpoint, expected: str) -> None:
    assert endpoint_url(base, endpoint) == expected


def test_completions_body_has_exact_prompt_and_output_length() -> None:
    body = request_body(Endpoint.COMPLETIONS, "m", 2000, 1000, random.Random(0))
    assert len(body["prompt"]) == 2000 and all(isinstance(t, int) for t in body["prompt"])
    assert body["max_tokens"] == 1000 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_body_is_text() -> None:
    body = request_body(Endpoint.CHAT, "m", 50, 10, random.Random(0))
    assert isinstance(body["messages"][0]["content"], str)
    assert body["max_tokens"] == 10 and body["ignore_eos"] is True


def test_plan_puts_warmup_first_and_distinct_prompts() -> None:
    plan = plan_stage(WORKLOAD, 8.0, "run")
    assert len(plan) == 23
    assert [p.warmup for p in plan] == [True] * 3 + [False] * 20
    assert [p.index for p in plan if not p.warmup] == list(range(20))
    assert len({p.request_id for p in plan}) == 23
    first_ids = {json.loads(p.body)["prompt"][0] for p in plan}
    assert len(first_ids) > 15  # requests do not share a cached prefix
    assert plan_stage(WORKLOAD, 8.0, "run")[5].offset_s == plan[5].offset_s


def test_headline_is_the_stage_at_the_configured_rate() -> None:
    assert headline_index([0.5, 1.0, 1.5], 1.0) == 1
    assert headline_index([1.0, 2.0, 3.0], 8.0) == 2
    assert headline_index([1.0, 2.0], 1.5) == 0
