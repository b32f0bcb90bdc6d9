"""`pdctl plan`: price every layout of a node for a workload, rank them, say whether to disaggregate.

Exit codes: 0 planned; 1 an output file could not be written or no layout fits; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from pd_runtime.argtypes import fraction, positive_float, positive_int
from pd_runtime.bench.search import parse_sweep
from pd_runtime.plan.catalog import MI300X, ModelSpec, get_model
from pd_runtime.plan.document import Context, Excluded, plan_document
from pd_runtime.plan.emit import manifest, supported, to_yaml
from pd_runtime.plan.layouts import Fit, NodeLayout, layouts, memory_fit
from pd_runtime.plan.price import Demand, Priced, Sample, assemble, sample
from pd_runtime.plan.rank import rank, verdict
from pd_runtime.plan.report import render_plan
from pd_runtime.plan.table import render_table
from pd_runtime.report_page import package_version
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import release

log = logging.getLogger(__name__)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl plan",
        description="Simulate every layout of one node (colocated NxTPt, disaggregated xP+yD) for a workload "
        "and rank them by SLO attainment and goodput (docs/when-to-disaggregate.md).",
    )
    parser.add_argument("--model", required=True, help="Hugging Face model name (a calibrated profile)")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt-tokens", type=positive_int, help="every prompt's length")
    prompts.add_argument(
        "--prompt-mix",
        type=prompt_mix,
        metavar="TOKENS:SHARE,...",
        help="a mixed workload: prompt lengths and their shares, e.g. 256:0.6,4000:0.4",
    )
    parser.add_argument(
        "--disaggregation-threshold",
        type=positive_int,
        metavar="TOKENS",
        help="price disaggregated layouts with the proxy's --disaggregation threshold: prompts below this many "
        "tokens on decode alone (default: every request disaggregated)",
    )
    parser.add_argument("--output-tokens", type=positive_int, required=True, help="max_tokens of each request")
    parser.add_argument("--rate", type=positive_float, required=True, help="the request rate to plan for (req/s)")
    parser.add_argument("--slo-ttft-ms", type=positive_float, required=True)
    parser.add_argument("--slo-itl-ms", type=positive_float, required=True, help="per-request mean ITL")
    parser.add_argument("--rates", default="0.5:10:0.5", help="FROM:TO:STEP grid for goodput and curves")
    parser.add_argument("--gpus", type=positive_int, default=8, help="GPUs of the node, all used by a layout")
    parser.add_argument("--target", type=fraction, default=0.9, help="attainment that counts as meeting the SLO")
    parser.add_argument("--requests", type=positive_int, default=100, help="requests per simulated run")
    parser.add_argument("--seeds", type=positive_int, default=4, help="arrival sequences per rate")
    parser.add_argument("--backend", choices=["rdma", "xgmi"], default="rdma", help="KV transfer of P/D layouts")
    parser.add_argument(
        "--vllm-version",
        default=PINNED_VLLM_VERSION,
        help="the vLLM release the engines run: from 0.33 write mode moves KV between prefill and decode of "
        "different TP sizes, so such layouts are ranked (default: the image's)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every request produces --output-tokens tokens (default: outputs end at the model's EOS draw, "
        "as `vllm bench serve` without --ignore-eos)",
    )
    parser.add_argument("--output", help="write the plan as JSON")
    parser.add_argument("--report", help="write a self-contained HTML report")
    parser.add_argument("--emit-yaml", help="write the best layout the PDDeployment API runs as YAML")
    parser.add_argument("--name", help="metadata.name of the emitted PDDeployment")
    parser.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="simulation processes")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model = get_model(args.model)
        rates = tuple(parse_sweep(args.rates))
        mixed_tp = release(args.vllm_version).heterogeneous_tp_write
    except ValueError as exc:
        parser.error(str(exc))
    demand = Demand(
        rate=args.rate,
        rates=rates,
        prompt_tokens=args.prompt_tokens or max(tokens for tokens, _ in args.prompt_mix),
        output_tokens=args.output_tokens,
        ttft_slo_s=args.slo_ttft_ms / 1000,
        itl_slo_s=args.slo_itl_ms / 1000,
        target=args.target,
        requests=args.requests,
        seeds=args.seeds,
        ignore_eos=args.ignore_eos,
        prompt_mix=args.prompt_mix or (),
        decode_alone_below=args.disaggregation_threshold or 0,
    )
    started = time.monotonic()
    fits, excluded, feasible = _feasible(model, layouts(args.gpus, args.backend, mixed_tp), demand)
    if not feasible:
        sys.stderr.write(f"pdctl plan: no layout of {args.gpus} GPUs fits {model.name}\n")
        return EXIT_FAILED
    ranked = rank(_price_all(model, feasible, demand, args.jobs, None if args.quiet else sys.stderr), demand.target)
    predicted = frozenset(p.layout.name for p in ranked if p.layout.predicted(model))
    found = verdict(ranked, demand.rate, demand.target, predicted)
    emitted = _emitted(ranked, model, demand, args)
    ctx = Context(model, MI300X, args.gpus, demand, _versions(model, args.vllm_version), time.monotonic() - started)
    doc = plan_document(ctx, ranked, fits, excluded, found, emitted)
    sys.stdout.write(render_table(doc))
    try:
        _write_outputs(args, doc, ranked, model, demand, emitted)
    except OSError as exc:
        sys.stderr.write(f"pdctl plan: {exc}\n")
        return EXIT_FAILED
    return EXIT_OK


def _feasible(
    model: ModelSpec, candidates: list[NodeLayout], demand: Demand
) -> tuple[dict[str, list[Fit]], list[Excluded], list[NodeLayout]]:
    fits: dict[str, list[Fit]] = {}
    excluded, feasible = [], []
    for layout in candidates:
        fit = memory_fit(model, MI300X, layout, demand.requests, demand.prompt_tokens, demand.output_tokens)
        fits[layout.name] = fit
        if all(f.fits for f in fit):
            feasible.append(layout)
        else:
            excluded.append(Excluded(layout, fit))
    return fits, excluded, feasible


def _price_all(
    model: ModelSpec, feasible: list[NodeLayout], demand: Demand, jobs: int, progress: TextIO | None
) -> list[Priced]:
    """Every (layout, rate) cell in a process pool; the bar counts finished cells."""
    cells = [(layout, rate) for layout in feasible for rate in (*demand.rates, demand.rate)]
    bar = _Bar(progress, len(cells))
    results: list[Sample] = []
    with ProcessPoolExecutor(max_workers=min(jobs, len(cells))) as pool:
        futures = [pool.submit(sample, model.profile, layout, demand, rate) for layout, rate in cells]
        for future in futures:
            results.append(future.result())
            bar.advance()
    bar.close()
    per_layout = len(demand.rates) + 1
    return [
        assemble(layout, demand, results[i * per_layout : (i + 1) * per_layout - 1], results[(i + 1) * per_layout - 1])
        for i, layout in enumerate(feasible)
    ]


def prompt_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``256:0.6,4000:0.4`` -> ((256, 0.6), (4000, 0.4)): positive lengths, positive shares."""
    try:
        pairs = [item.split(":") for item in text.split(",")]
        mix = tuple((int(tokens), float(share)) for tokens, share in pairs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not TOKENS:SHARE,...: {text!r}") from None
    if any(tokens < 1 or not share > 0 for tokens, share in mix):
        raise argparse.ArgumentTypeError(f"lengths and shares must be positive: {text!r}")
    return mix


class _Bar:
    WIDTH = 24

    def __init__(self, stream: TextIO | None, total: int) -> None:
        self._stream, self._total, self._done = stream, total, 0
        self._tty = bool(stream is not None and stream.isatty())
        self._started = time.monotonic()

    def advance(self) -> None:
        self._done += 1
        if self._tty:
            self._draw("\r")

    def close(self) -> None:
        self._draw("\r" if self._tty else "")
        if self._stream is not None:
            self._stream.write("\n")

    def _draw(self, prefix: str) -> None:
        if self._stream is None:
            return
        filled = self.WIDTH * self._done // max(self._total, 1)
        elapsed = time.monotonic() - self._started
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._stream.write(f"{prefix}simulating [{bar}] {self._done}/{self._total} layout-rates {elapsed:5.1f}s")
        self._stream.flush()


def _emitted(ranked: list[Priced], model: ModelSpec, demand: Demand, args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.emit_yaml:
        return None
    chosen = next((p for p in ranked if supported(p.layout)), None)
    if chosen is None:
        return {"path": None, "layout": None, "note": "no ranked layout is expressible in the PDDeployment API"}
    note = f"wrote {chosen.layout.name}, the top-ranked layout"
    if chosen is not ranked[0]:
        note = (
            f"the top layout {ranked[0].layout.name} needs more colocated engines than the PDDeployment API runs "
            f"(one or two); wrote {chosen.layout.name}, rank {ranked.index(chosen) + 1}, instead"
        )
    return {
        "path": args.emit_yaml,
        "layout": chosen.layout.name,
        "note": note,
        "manifest": manifest(chosen.layout, model.name, demand, args.name, args.vllm_version),
    }


def _write_outputs(
    args: argparse.Namespace, doc: dict[str, Any], ranked: list[Priced], model: ModelSpec, demand: Demand,
    emitted: dict[str, Any] | None,
) -> None:  # fmt: skip
    if emitted is not None and emitted.get("manifest") is not None:
        header = f"# pdctl plan: {emitted['note']}\n# check kvTransfer.rdma.resourceName against your cluster\n"
        Path(args.emit_yaml).write_text(header + to_yaml(emitted["manifest"]) + "\n")
        sys.stderr.write(f"pdctl plan: {emitted['note']}: {args.emit_yaml}\n")
    if args.output:
        Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
    if args.report:
        Path(args.report).write_text(render_plan(doc, ranked))


def _versions(model: ModelSpec, vllm_version: str) -> dict[str, str]:
    return {
        "pd-operator": package_version(),
        "simulator profile": model.profile.name,
        "simulated vLLM": vllm_version,
    }
