"""The shell that runs the stages a mode asks for: one rate, a sweep, or the goodput search."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from pd_runtime.bench.client import BenchClient
from pd_runtime.bench.plan import Mode, RunResult, Workload, headline_index, plan_stage
from pd_runtime.bench.progress import ProgressFactory
from pd_runtime.bench.search import Probe, SearchParams, bracket, next_search_rate
from pd_runtime.bench.stage import StageResult, summarize_stage

log = logging.getLogger(__name__)


class Runner:
    def __init__(self, client: BenchClient, workload: Workload, progress: ProgressFactory) -> None:
        self._client = client
        self._workload = workload
        self._progress = progress
        self._run_id = uuid.uuid4().hex[:8]

    async def measure(self, rate: float) -> StageResult:
        plan = plan_stage(self._workload, rate, self._run_id)
        bar = self._progress(f"{rate:g} req/s", len(plan))
        try:
            timings = await self._client.run_stage(plan, bar.advance)
        finally:
            bar.close()
        stage = summarize_stage(rate, timings, self._workload.slo, self._workload.exact_tokens)
        log.info(
            "rate %g req/s: %d/%d good (%.1f %%), %d errors",
            rate,
            stage.good,
            stage.requests,
            100 * stage.attainment,
            stage.errors,
        )
        return stage

    async def run(
        self, mode: Mode, rate: float, sweep: Sequence[float] = (), search: SearchParams | None = None
    ) -> RunResult:
        """Measure the stages of ``mode``; the headline stage is the one at ``rate``."""
        started, t0 = datetime.now(UTC), time.monotonic()
        target = self._workload.slo.target
        if mode is Mode.SEARCH:
            stages = await self._search(search or SearchParams(start_rate=rate, target=target))
        else:
            stages = [await self.measure(r) for r in (sweep if mode is Mode.SWEEP else [rate])]
        return RunResult(
            mode=mode,
            started=started,
            duration_s=time.monotonic() - t0,
            stages=tuple(stages),
            headline=headline_index([s.rate for s in stages], rate),
            bracket=None if mode is Mode.RATE else bracket([_probe(s) for s in stages], target),
        )

    async def _search(self, params: SearchParams) -> list[StageResult]:
        stages: list[StageResult] = []
        while (rate := next_search_rate(params, [_probe(s) for s in stages])) is not None:
            stages.append(await self.measure(rate))
        return stages


def _probe(stage: StageResult) -> Probe:
    return Probe(rate=stage.rate, attainment=stage.attainment)
