"""Attainment-against-rate curves read from result documents: what `pdctl bench --plot` draws.

Kept apart from the drawing (``plot``, which needs matplotlib, the `plot` extra), so the bench checks the
result files it is asked to plot before a run without importing matplotlib.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
