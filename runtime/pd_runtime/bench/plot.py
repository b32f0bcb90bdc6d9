"""SLO attainment against request rate, one line per curve (the seed's Figure 4 view).

Uses matplotlib's Agg canvas directly (no pyplot, no display), so it works in a container or a Job.
The only module that imports matplotlib (the `plot` extra); `pdctl bench` imports it only for --plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pd_runtime.bench.curves import Curve


def draw(curves: Sequence[Curve], output: Path, title: str = "SLO attainment vs request rate") -> None:
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for curve in curves:
        (line,) = axes.plot(curve.rates, curve.attainment_pct, marker="o", markersize=4, label=curve.label)
        axes.fill_between(curve.rates, curve.ci_low_pct, curve.ci_high_pct, color=line.get_color(), alpha=0.12)
    targets = {c.target_pct for c in curves if c.target_pct is not None}
    for target in sorted(targets):
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g} %")
    axes.set_xlabel("request rate (req/s)")
    axes.set_ylabel("SLO attainment (%)")
    axes.set_ylim(-2, 102)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(output)
