"""Stage plans (warmup first, distinct prompts, repeatable) and the headline stage."""

from __future__ import annotations

import json

from pd_runtime.bench.plan import Workload, headline_index, plan_stage
from pd_runtime.bench.slo import Slo
from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.arrivals import Arrival

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
