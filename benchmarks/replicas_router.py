"""Throughput and goodput of 1, 2 and 3 replicas behind `pdctl proxy --router`, live, side by side in one run.

Each replica is real processes (`pdctl proxy` + two `pdctl sim-engine`, 1P1D write, via
pd_runtime.sim.stack) on the calibrated qwen3-235b-mi300x profile; the router is `pdctl proxy --router`
over them; `pdctl bench` drives the router. Time runs ``--time-scale`` times faster, so the offered
rate is multiplied and the SLO divided by it (model-time numbers are reported). Outputs are shortened
(default 100 tokens) so that the Python processes of three replicas fit a small machine.

Usage: .venv/bin/python benchmarks/replicas_router.py [--rate 12] [--time-scale 2] [--requests 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pd_runtime.localports import PortReservation
from pd_runtime.sim.stack import MODEL, LocalStack, launch
from pd_runtime.sim.system import Topology

PDCTL = str(Path(sys.executable).parent / "pdctl")
TTFT_MS, ITL_MS = 1000.0, 50.0  # the seed's SLO, model time


def start_replica(time_scale: float, logs: Path) -> LocalStack:
    """One 1P1D stack (proxy, prefill, decode), ready."""
    stack = launch(Topology("write"), "qwen3-235b-mi300x", time_scale, logs)
    try:
        asyncio.run(stack.wait_ready(timeout_s=60))
    except BaseException:
        stack.stop()
        raise
    return stack


def start_router(stacks: list[LocalStack], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    ports = PortReservation()  # held until the router listens on it
    port = ports.port()
    backends = [
        f"--backend={s.proxy_url.removeprefix('http://')}={s.admin_url.removeprefix('http://')}" for s in stacks
    ]
    argv = [PDCTL, "proxy", "--router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING", *backends]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/ready", timeout=1, trust_env=False).status_code == 200:
                ports.release()
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    ports.release()
    proc.kill()
    raise RuntimeError("router not ready")


def measure(replicas: int, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    stacks: list[LocalStack] = []
    router = None
    try:
        for i in range(replicas):
            stacks.append(start_replica(args.time_scale, scratch / f"{replicas}" / f"replica-{i}"))
        router, url = start_router(stacks, scratch / f"router-{replicas}.log")
        result = scratch / f"summary-{replicas}.json"
        scale = args.time_scale
        subprocess.run(
            [PDCTL, "bench", "--url", url, "--model", MODEL, "--rate", str(args.rate * scale),
             "--requests", str(args.requests), "--prompt-tokens", "2000", "--output-tokens", str(args.output_tokens),
             "--slo-ttft-ms", str(TTFT_MS / scale), "--slo-itl-ms", str(ITL_MS / scale), "--seed", "0",
             "--result-file", str(result)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        summary = json.loads(result.read_text())
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=10)
        for stack in stacks:
            stack.stop()
    duration = summary["duration_s"] * args.time_scale  # model time
    completed = summary["requests"] - summary["errors"]
    return {
        "replicas": replicas,
        "attainment": summary["attainment"],
        "throughput": completed / duration,
        "goodput": summary["good"] / duration,
        "ttft_p90": summary["ttft_ms"]["p90"] * args.time_scale if summary["ttft_ms"]["p90"] is not None else 0.0,
        "itl_p90": summary["itl_ms"]["p90"] * args.time_scale if summary["itl_ms"]["p90"] is not None else 0.0,
        "errors": summary["errors"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=12.0, help="offered rate, requests per second of model time")
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--output-tokens", type=int, default=100)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--log-dir", help="keep the processes' logs here (default: a new temporary directory)")
    args = parser.parse_args()
    scratch = Path(args.log_dir or tempfile.mkdtemp(prefix="replicas-router-"))
    rows = [measure(int(n), args, scratch) for n in args.replicas.split(",")]
    out = sys.stdout
    out.write(
        f"offered {args.rate:g} req/s, {args.requests} requests of 2000 + {args.output_tokens} tokens, "
        f"SLO TTFT <= {TTFT_MS:g} ms and ITL <= {ITL_MS:g} ms (model time), time scale {args.time_scale:g}\n\n"
    )
    out.write(
        "| replicas | attainment | throughput (req/s) | goodput (req/s) | TTFT p90 (ms) | ITL p90 (ms) | errors |\n"
    )
    out.write("|---|---|---|---|---|---|---|\n")
    for r in rows:
        out.write(
            f"| {r['replicas']} | {r['attainment']:.0%} | {r['throughput']:.2f} | {r['goodput']:.2f} "
            f"| {r['ttft_p90']:.0f} | {r['itl_p90']:.1f} | {r['errors']} |\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
