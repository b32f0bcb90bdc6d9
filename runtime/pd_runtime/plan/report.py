"""The plan's HTML page: the document's tables plus inline SVG charts of every priced layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pd_runtime.plan.price import Priced
from pd_runtime.report_page import render
from pd_runtime.svgcharts import Series, cdf_series, line_chart


def render_plan(doc: dict[str, Any], ranked: Sequence[Priced]) -> str:
    curves = [
        Series(p.layout.name, [(c.rate, 100 * c.attainment) for c in p.curve], p.layout.kind != "colocated")
        for p in ranked
    ]
    ttft = [cdf_series(p.layout.name, p.ttft_s, scale=1000) for p in ranked]
    itl = [cdf_series(p.layout.name, p.itl_s, scale=1000) for p in ranked]
    inputs = doc["inputs"]
    return render(
        "plan.html.j2",
        title=f"pdctl plan: {inputs['model']} on {inputs['gpus']}x {inputs['gpu']}",
        doc=doc,
        versions=doc["versions"],
        inputs=list(inputs.items()),
        curves_svg=line_chart("SLO attainment", curves, "request rate (req/s)", "attainment (%)", 100.0),
        ttft_svg=line_chart("TTFT", ttft, "TTFT (ms)", "requests at or below (%)", 100.0),
        itl_svg=line_chart("ITL", itl, "per-request mean ITL (ms)", "requests at or below (%)", 100.0),
    )
