"""Pure: the HTML page of one `pdctl bench` run (`--report FILE.html`): its stages as a table, the
attainment-vs-rate curve, and the TTFT and ITL distributions of the headline stage."""

from __future__ import annotations

from typing import Any

from pd_runtime.bench.plan import RunResult, Workload
from pd_runtime.report_page import render
from pd_runtime.svgcharts import Series, cdf_series, line_chart


def render_bench(run: RunResult, workload: Workload, document: dict[str, Any], versions: dict[str, str]) -> str:
    label = document["config"]["label"] or workload.model
    headline = run.stages[run.headline]
    curve = [Series(label, [(s.rate, 100 * s.attainment) for s in sorted(run.stages, key=lambda s: s.rate)])]
    ttft = [cdf_series(label, [r.ttft_ms for r in headline.records])]
    itl = [cdf_series(label, [r.itl_ms for r in headline.records])]
    inputs = {**document["config"], "model": workload.model, "requests": workload.requests, "mode": run.mode.value}
    inputs |= {"slo_ttft_ms": workload.slo.ttft_ms, "slo_itl_ms": workload.slo.itl_ms, "target": workload.slo.target}
    return render(
        "bench.html.j2",
        title=f"pdctl bench: {label}",
        label=label,
        stages=run.stages,
        headline=headline,
        target=workload.slo.target,
        goodput=document.get("goodput_rate"),
        inputs=list(inputs.items()),
        versions=versions,
        curves_svg=line_chart("SLO attainment", curve, "request rate (req/s)", "attainment (%)", 100.0),
        ttft_svg=line_chart("TTFT", ttft, "TTFT (ms)", "requests at or below (%)", 100.0),
        itl_svg=line_chart("ITL", itl, "per-request mean ITL (ms)", "requests at or below (%)", 100.0),
    )
