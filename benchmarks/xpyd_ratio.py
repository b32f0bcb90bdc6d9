"""The prefill:decode ratio inside one 8-GPU node, measured live: 1P1D vs 2P1D vs 1P2D (issue 13).

  python benchmarks/xpyd_ratio.py [--rates 4,8,12] [--time-scale 1] [--seed 3]

Each layout runs as real processes (`pdctl proxy --policy least_load` + `pdctl sim-engine` with the
calibrated `qwen3-235b-mi300x` profile, ZMQ registration and side channels, write mode), side by side in
one run, with the seed's workload (100 requests of 2000 prompt tokens, outputs ending at EOS) at each
rate. Every layout uses all 8 GPUs: 1P1D is TP4 + TP4, 2P1D two TP2 prefill engines + a TP4 decode,
1P2D a TP4 prefill + two TP2 decode engines. Reported: good requests (TTFT < 1 s and ITL < 50 ms, the
seed's SLO), goodput (good requests per second of the run), output-token throughput, TTFT p50/p90.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pd_runtime.sim.profiles import QWEN3_235B_MI300X
from pd_runtime.sim.replay import replay
from pd_runtime.sim.stack import launch
from pd_runtime.sim.system import SEED_ITL_SLO_S, SEED_TTFT_SLO_S, EngineShape, RequestResult, Topology

TP4 = EngineShape(tp=4, max_batched_tokens=4096, max_num_seqs=64)
TP2 = EngineShape(tp=2, max_batched_tokens=4096, max_num_seqs=64)
LAYOUTS = {
    "1P1D (TP4 + TP4)": Topology("write", prefill=TP4, decode=TP4),
    "2P1D (2xTP2 + TP4)": Topology("write", prefill=TP2, decode=TP4, prefills=2),
    "1P2D (TP4 + 2xTP2)": Topology("write", prefill=TP4, decode=TP2, decodes=2),
}


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def row(name: str, rate: float, results: list[RequestResult]) -> str:
    good = sum(r.good(SEED_TTFT_SLO_S, SEED_ITL_SLO_S) for r in results)
    served = [r for r in results if r.token_times]
    span = max(r.token_times[-1] for r in served) - min(r.arrival for r in results) if served else float("nan")
    tokens = sum(len(r.token_times) for r in served)
    ttfts = [1000 * r.ttft for r in served]
    return (
        f"| {name} | {rate:g} | {good} | {good / span:.2f} | {tokens / span:.0f} | "
        f"{statistics.median(ttfts):.0f} / {_percentile(ttfts, 0.9):.0f} | {len(results) - len(served)} |"
    )


async def measure(topology: Topology, rate: float, scale: float, seed: int, log_dir: Path) -> list[RequestResult]:
    stack = launch(topology, QWEN3_235B_MI300X.name, scale, log_dir, extra_proxy_args=("--policy", "least_load"))
    try:
        await stack.wait_ready(timeout_s=60)
        await asyncio.sleep(2.5)  # every engine registered and probed (wait_ready needs only one per role)
        return await replay(stack.proxy_url, rate, scale, seed)
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="4,8,12", help="request rates (req/s, model time), comma-separated")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="xpyd-ratio-"))
    _out(f"logs in {log_dir}; SLO TTFT < {SEED_TTFT_SLO_S * 1000:g} ms, ITL < {SEED_ITL_SLO_S * 1000:g} ms")
    _out("| layout | rate | good of 100 | goodput (good/s) | output tok/s | TTFT p50 / p90 ms | failed |")
    _out("|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    for rate in (float(r) for r in args.rates.split(",")):
        for name, topology in LAYOUTS.items():
            path = log_dir / f"{name.split()[0]}-{rate:g}"
            results = asyncio.run(measure(topology, rate, args.time_scale, args.seed, path))
            _out(row(name, rate, results))
    _out(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
