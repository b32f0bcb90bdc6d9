"""Draw docs/img/goodput-sweep.png: SLO attainment against rate with `pdctl bench --sweep` and `--plot`.

Each configuration is started as real processes (`pdctl proxy` + `pdctl sim-engine`, via
pd_runtime.sim.stack), swept with `pdctl bench`, and the result files are drawn in one figure.
Outputs are shortened (default 100 tokens, not the seed's 1000) so that a sweep of a Python proxy and
simulator fits a small machine; this illustrates the bench's sweep and plot, the calibrated
Figure 4 of the seed lives in docs/simulator.md.

Usage: .venv/bin/python benchmarks/goodput_figure.py [--output-tokens 100] [--requests 50] [--sweep 1:10:1]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from pd_runtime.sim.stack import MODEL, launch
from pd_runtime.sim.system import EngineShape, Topology

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "docs" / "img" / "goodput-sweep.png"
PDCTL = str(Path(sys.executable).parent / "pdctl")
CONFIGURATIONS = {
    "1xTP8 colocated": Topology("colocated", engines=1, engine=EngineShape(tp=8)),
    "2xTP4 colocated": Topology("colocated", engines=2, engine=EngineShape(tp=4)),
    "1P1D write (TP4 + TP4)": Topology("write"),
}


def sweep(label: str, topology: Topology, args: argparse.Namespace, scratch: Path) -> Path:
    stack = launch(topology, profile="qwen3-235b-mi300x", time_scale=1.0, log_dir=scratch / "logs" / label)
    output = scratch / f"{len(list(scratch.glob('*.json')))}.json"
    try:
        asyncio.run(stack.wait_ready(timeout_s=60))
        subprocess.run(
            [PDCTL, "bench", "--url", stack.proxy_url, "--model", MODEL, "--rate", "8",
             "--requests", str(args.requests), "--prompt-tokens", "2000", "--output-tokens", str(args.output_tokens),
             "--slo-ttft-ms", "1000", "--slo-itl-ms", "50", "--sweep", args.sweep, "--label", label,
             "--output", str(output)],
            check=True,
        )  # fmt: skip
    finally:
        stack.stop()
    return output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-tokens", type=int, default=100)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--sweep", default="1:10:1")
    args = parser.parse_args()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        results = [sweep(label, topology, args, scratch) for label, topology in CONFIGURATIONS.items()]
        subprocess.run([PDCTL, "bench", "--plot", str(FIGURE), *map(str, results)], check=True)
    sys.stdout.write(f"wrote {FIGURE}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
