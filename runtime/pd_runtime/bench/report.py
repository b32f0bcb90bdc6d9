"""Pure: the terminal table a person reads after a run."""

from __future__ import annotations

from collections import Counter

from pd_runtime.bench.plan import Mode, RunResult, Workload
from pd_runtime.bench.stage import StageResult
from pd_runtime.bench.stats import Distribution


def render_table(run: RunResult, workload: Workload) -> str:
    slo = workload.slo
    lines = [
        f"model {workload.model}: {workload.prompt_tokens} prompt -> {workload.output_tokens} output tokens, "
        f"{workload.requests} requests per rate (+{workload.warmup} warm-up), {workload.arrival.value} arrivals",
        f"SLO: TTFT <= {slo.ttft_ms:g} ms and ITL <= {slo.itl_ms:g} ms; target attainment {100 * slo.target:g} %",
        "",
    ]
    if run.mode is Mode.RATE:
        lines += _stage_detail(run.stages[0], slo.target)
    else:
        lines += _stage_rows(run, slo.target)
    lines.append("")
    lines.append(f"run took {run.duration_s:.1f} s")
    return "\n".join(lines) + "\n"


def _stage_detail(stage: StageResult, target: float) -> list[str]:
    lo, hi = stage.attainment_ci
    verdict = "meets" if stage.passes(target) else "misses"
    lines = [
        f"{'':<12}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}",
        _distribution_row("TTFT (ms)", stage.ttft_ms),
        _distribution_row("ITL (ms)", stage.itl_ms),
        _distribution_row("E2E (ms)", stage.e2e_ms),
        "",
        f"rate {stage.rate:g} req/s (achieved {_fmt(stage.achieved_rate, '.2f')}): "
        f"{stage.good}/{stage.requests} good, attainment {100 * stage.attainment:.1f} % "
        f"(95 % CI {100 * lo:.1f}-{100 * hi:.1f} %), {verdict} the target",
        f"errors {stage.errors}{_error_kinds(stage)}, short replies {stage.short_replies}, "
        f"send lag p99 {_fmt(stage.send_lag_ms.p99, '.2f')} ms",
    ]
    return lines


def _stage_rows(run: RunResult, target: float) -> list[str]:
    header = (
        f"{'rate':>8} {'good':>9} {'errors':>6} {'attain %':>9} {'95% CI':>13} {'TTFT p90':>9} {'ITL p90':>8}  pass"
    )
    lines = [header]
    for i, stage in enumerate(run.stages):
        lo, hi = stage.attainment_ci
        mark = "*" if i == run.headline else " "
        lines.append(
            f"{stage.rate:>7g}{mark} {stage.good:>4}/{stage.requests:<4} {stage.errors:>6} "
            f"{100 * stage.attainment:>9.1f} {100 * lo:>6.1f}-{100 * hi:<6.1f} "
            f"{_fmt(stage.ttft_ms.p90, '.1f'):>9} {_fmt(stage.itl_ms.p90, '.1f'):>8}  "
            f"{'yes' if stage.passes(target) else 'no'}"
        )
    lines.append("(* = the stage at --rate, whose figures the summary reports)")
    kinds = sum((Counter(stage.error_kinds) for stage in run.stages), Counter[str]())
    if kinds:
        lines.append("errors by kind: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())))
    if run.bracket is not None:
        passing, failing = run.bracket.passing, run.bracket.failing
        lines.append(
            f"goodput at {100 * target:g} % attainment: {_fmt(passing, 'g')} req/s "
            f"(lowest failing rate: {_fmt(failing, 'g')})"
        )
    return lines


def _distribution_row(name: str, dist: Distribution) -> str:
    cells = "".join(f"{_fmt(v, '.1f'):>10}" for v in (dist.p50, dist.p90, dist.p99, dist.mean))
    return f"{name:<12}{cells}"


def _error_kinds(stage: StageResult) -> str:
    if not stage.error_kinds:
        return ""
    return " (" + ", ".join(f"{kind} {count}" for kind, count in sorted(stage.error_kinds.items())) + ")"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
