"""Inline SVG line charts for the HTML report: no plotting library, no external files, text a browser
draws as is. Pure string building."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 60, 210, 20, 50


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def line_chart(title: str, series: Sequence[Series], x_label: str, y_label: str, y_max: float | None = None) -> str:
    """One SVG with a line per series, axes with five ticks each, and a legend on the right."""
    xs = [x for s in series for x, _ in s.points] or [0.0, 1.0]
    ys = [y for s in series for _, y in s.points] or [0.0, 1.0]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = 0.0, y_max if y_max is not None else max(ys) * 1.05 or 1.0
    x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (min(y, y_hi) - y_lo) / (y_hi - y_lo) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
    ]
    for i in range(5):
        xv = x_lo + (x_hi - x_lo) * i / 4
        yv = y_lo + (y_hi - y_lo) * i / 4
        parts.append(
            f'<text x="{px(xv):.1f}" y="{TOP + plot_h + 16}" font-size="11" text-anchor="middle">{xv:.3g}</text>'
        )
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(yv):.1f}" y2="{py(yv):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{py(yv) + 4:.1f}" font-size="11" text-anchor="end">{yv:.3g}</text>')
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" font-size="12" text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{TOP + plot_h / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_label)}</text>'
    )
    for index, s in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline class="series" data-label="{escape(s.label)}" points="{path}" fill="none" '
                     f'stroke="{color}" stroke-width="2"{dash}/>')  # fmt: skip
        ly = TOP + 14 + 18 * index
        parts.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{ly - 4}" y2="{ly - 4}" '
                     f'stroke="{color}" stroke-width="2"{dash}/>')  # fmt: skip
        parts.append(f'<text x="{WIDTH - RIGHT + 38}" y="{ly}" font-size="11">{escape(s.label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def cdf(values: Sequence[float], points: int = 50) -> list[tuple[float, float]]:
    """(value, fraction of requests at or below it): the empirical distribution, thinned to ``points``."""
    ordered = sorted(v for v in values if v == v and v != float("inf"))
    if not ordered:
        return []
    step = max(1, len(ordered) // points)
    picked = [*range(0, len(ordered), step), len(ordered) - 1]
    return [(ordered[i], (i + 1) / len(ordered)) for i in sorted(set(picked))]


def cdf_series(label: str, values: Sequence[float | None], scale: float = 1.0) -> Series:
    """A cumulative-share line (percent of requests at or below each value), values times ``scale``."""
    return Series(label, [(scale * v, 100 * f) for v, f in cdf([v for v in values if v is not None])])
