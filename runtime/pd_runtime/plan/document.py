"""The plan as one JSON-ready document: inputs, verdict, every priced layout, every layout left out.

`--output plan.json` writes it; the HTML report renders from it plus the raw latencies for charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pd_runtime.plan.catalog import GpuSpec, ModelSpec
from pd_runtime.plan.layouts import Fit, NodeLayout
from pd_runtime.plan.price import Demand, Priced
from pd_runtime.plan.rank import Verdict

PREDICTED_NOTE = "TP sizes the profile was not calibrated at (TP2), timed by its TP scaling model (docs/simulator.md)"


@dataclass(frozen=True)
class Excluded:
    layout: NodeLayout
    fits: Sequence[Fit]

    @property
    def reason(self) -> str:
        worst = self.worst
        return (
            f"{worst.role} TP{worst.tp}: {worst.weights_gb:g} GB of weights per GPU leave room for "
            f"{worst.kv_capacity_tokens} KV tokens, {worst.kv_needed_tokens} needed"
        )

    @property
    def worst(self) -> Fit:
        return next(f for f in self.fits if not f.fits)


@dataclass(frozen=True)
class Context:
    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    demand: Demand
    versions: dict[str, str]
    duration_s: float


def plan_document(
    ctx: Context, ranked: Sequence[Priced], fits: Mapping[str, Sequence[Fit]], excluded: Sequence[Excluded],
    verdict: Verdict, emitted: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    demand = ctx.demand
    return {
        "inputs": {
            "model": ctx.model.name,
            "gpu": ctx.gpu.name,
            "gpus": ctx.gpus,
            **{k: v for k, v in asdict(demand).items() if k != "rates"},
            "rates": list(demand.rates),
        },
        "versions": ctx.versions,
        "verdict": {"text": verdict.text, "reason": verdict.reason},
        "layouts": [
            _layout_row(rank, p, ctx.model, demand, fits[p.layout.name]) for rank, p in enumerate(ranked, start=1)
        ],
        "excluded": [
            {"layout": e.layout.name, "kind": e.layout.kind, "reason": e.reason, "tp": e.worst.tp} for e in excluded
        ],
        "emitted": emitted,
        "predictedNote": PREDICTED_NOTE,
        "durationSeconds": round(ctx.duration_s, 2),
    }


def _layout_row(rank: int, p: Priced, model: ModelSpec, demand: Demand, fits: Sequence[Fit]) -> dict[str, Any]:
    low, high = p.interval
    goodput = p.goodput(demand.target)
    return {
        "rank": rank,
        "layout": p.layout.name,
        "kind": p.layout.kind,
        "gpus": p.layout.gpus,
        "backend": p.layout.backend if p.layout.kind == "disaggregated" else None,
        "predicted": p.layout.predicted(model),
        "attainment": round(p.at_rate.attainment, 4),
        "attainmentInterval": [round(low, 4), round(high, 4)],
        "attainmentRuns": [round(r, 4) for r in p.runs],
        "requests": p.at_rate.total,
        "goodputRate": goodput,
        "goodputPerGpu": round(goodput / p.layout.gpus, 4),
        "ttftMs": _ms(p.ttft.as_dict(6)),
        "itlMs": _ms(p.itl.as_dict(6)),
        "ttftMisses": p.ttft_misses,
        "itlMisses": p.itl_misses,
        "curve": [{"rate": c.rate, "attainment": round(c.attainment, 4)} for c in p.curve],
        "memory": [asdict(f) | {"fits": f.fits} for f in fits],
    }


def _ms(dist: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(1000 * v, 1) for k, v in dist.items()}
