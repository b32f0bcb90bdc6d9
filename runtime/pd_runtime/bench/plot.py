"""SLO attainment against request rate, one line per result file (the seed's Figure 4 view).

Uses matplotlib's Agg canvas directly (no pyplot, no display), so it works in a container or a Job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


@dataclass(frozen=True)
class Curve:
    label: str
    rates: tuple[float, ...]
    attainment_pct: tuple[float, ...]
    ci_low_pct: tuple[float, ...]
    ci_high_pct: tuple[float, ...]
    target_pct: float | None


def curve_from_document(document: dict[str, Any], fallback_label: str) -> Curve:
    """A full result gives one point per stage; a summary gives its single point."""
    config = document.get("config") or {}
    label = config.get("label") or fallback_label
    stages = document.get("stages") or [document]
    points = sorted(
        (float(s["rate"]), 100 * float(s["attainment"]), *(100 * float(b) for b in s["attainment_ci"])) for s in stages
    )
    target = (document.get("slo") or {}).get("target")
    return Curve(
        label=str(label),
        rates=tuple(p[0] for p in points),
        attainment_pct=tuple(p[1] for p in points),
        ci_low_pct=tuple(p[2] for p in points),
        ci_high_pct=tuple(p[3] for p in points),
        target_pct=None if target is None else 100 * float(target),
    )


def load_curves(paths: Sequence[Path]) -> list[Curve]:
    curves = []
    for path in paths:
        try:
            document = json.loads(path.read_text())
            curves.append(curve_from_document(document, fallback_label=path.stem))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a pdctl bench result ({exc})") from exc
    return curves


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
