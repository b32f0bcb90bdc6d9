"""Pure: what a run sends (workload, per-stage request plans) and what it found (RunResult)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pd_runtime.bench.search import Bracket
from pd_runtime.bench.slo import Slo
from pd_runtime.bench.stage import StageResult
from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.arrivals import Arrival, arrival_offsets, stage_rng
from pd_runtime.workload.payload import encode_body, request_body


class Mode(StrEnum):
    RATE = "rate"
    SWEEP = "sweep"
    SEARCH = "search"


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    """Position among the measured requests; warm-up requests have negative indexes."""
    request_id: str
    warmup: bool
    offset_s: float
    body: bytes


@dataclass(frozen=True)
class Workload:
    """What every stage sends; only the rate changes between stages."""

    model: str
    endpoint: Endpoint
    requests: int
    warmup: int
    prompt_tokens: int
    output_tokens: int
    arrival: Arrival
    seed: int
    slo: Slo
    ignore_eos: bool = True
    """False: replies may end at EOS, so their length varies and a one-token reply is legitimate."""

    @property
    def exact_tokens(self) -> int:
        """Tokens every reply must have for the one-token rule: the output length, or 1 when EOS may end it."""
        return self.output_tokens if self.ignore_eos else 1


@dataclass(frozen=True)
class RunResult:
    mode: Mode
    started: datetime
    duration_s: float
    stages: tuple[StageResult, ...]
    headline: int
    """Index of the stage measured at the configured --rate (the nearest swept rate in a sweep)."""
    bracket: Bracket | None


def plan_stage(workload: Workload, rate: float, run_id: str) -> list[PlannedRequest]:
    """Warm-up requests first, then the measured ones, all on one arrival process."""
    total = workload.warmup + workload.requests
    offsets = arrival_offsets(total, rate, workload.arrival, stage_rng(workload.seed, rate, "arrivals"))
    prompts = stage_rng(workload.seed, rate, "prompts")
    return [
        PlannedRequest(
            index=i - workload.warmup,
            request_id=f"{run_id}-r{rate:g}-{i}",
            warmup=i < workload.warmup,
            offset_s=offset,
            body=encode_body(
                request_body(
                    workload.endpoint,
                    workload.model,
                    workload.prompt_tokens,
                    workload.output_tokens,
                    prompts,
                    ignore_eos=workload.ignore_eos,
                )
            ),
        )
        for i, offset in enumerate(offsets)
    ]


def headline_index(rates: Sequence[float], configured: float) -> int:
    """The stage the top-level figures describe: the one at --rate, else the nearest (lower on a tie)."""
    return min(range(len(rates)), key=lambda i: (abs(rates[i] - configured), rates[i]))
