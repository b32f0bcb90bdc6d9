"""When prefix_affinity helps: shared-prompt workloads on two prefill engines with prefix caching (issue 21).

  python benchmarks/prefix_affinity.py [--rate 3] [--requests 150] [--cache-blocks 4000] [--time-scale 1] [--seed 5]

Real processes (`pdctl proxy` + `pdctl sim-engine`, the calibrated `qwen3-235b-mi300x` profile, write
mode), 2P1D: two TP2 prefill engines and a TP4 decode, every engine modelling vLLM's prefix cache with
room for `--cache-blocks` blocks of 16 tokens per engine (`--sim-prefix-cache-blocks`). Prompts are 6656
token ids, 16 output tokens; each policy (`least_load`, `prefix_affinity`) gets the same arrivals of three
workloads:

- **16 system prompts**: 6144 shared tokens (one of 16, drawn at random: 384 blocks each) + 512 of the
  request's own. One engine's cache holds about 10 of the 16 prefixes: engines that each see all 16 keep
  evicting some; prefix_affinity gives each engine about half of them, which fit.
- **no shared prefix**: every prompt its own; nothing to cache.
- **one system prompt**: all requests share one 6144-token prefix, which both engines cache anyway.

Reported per row: the prefill engines' prefix-cache hit rate (`vllm:prefix_cache_hits` over
`vllm:prefix_cache_queries`, in tokens), TTFT p50 / p90 (model ms), and how the prefills split over the two
engines.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pd_runtime.sim.profiles import QWEN3_235B_MI300X
from pd_runtime.sim.stack import MODEL, LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology, poisson_arrivals

TP4 = EngineShape(tp=4, max_batched_tokens=4096, max_num_seqs=64)
TP2 = EngineShape(tp=2, max_batched_tokens=4096, max_num_seqs=64)
LAYOUT = Topology("write", prefill=TP2, decode=TP4, prefills=2)
SHARED, OWN, OUTPUT = 6144, 512, 16
POLICIES = ("least_load", "prefix_affinity")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def prompts(workload: str, count: int, seed: int) -> list[list[int]]:
    """Token-id prompts of SHARED + OWN tokens; the shared part by workload (module docstring)."""
    rng = random.Random(f"{seed}/{workload}")
    groups = {"16 system prompts": 16, "one system prompt": 1}.get(workload)
    out = []
    for i in range(count):
        group = rng.randrange(groups) if groups else 1000 + i
        shared = [10 + (group * 7919 + j) % 30000 for j in range(SHARED)]
        out.append(shared + [10 + (i * 104729 + j) % 30000 for j in range(OWN)])
    return out


async def _send(session: aiohttp.ClientSession, url: str, at: float, prompt: list[int]) -> float | None:
    """One streamed request at ``at`` (perf_counter); its TTFT in wall seconds, None when it failed."""
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    sent = time.perf_counter()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT, "ignore_eos": True, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return None
        first: float | None = None
        async for chunk in resp.content.iter_any():
            if first is None and b'"text":"' in chunk and b'"text":""' not in chunk:
                first = time.perf_counter() - sent
        return first


async def _cache_tokens(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """An engine's prefix-cache (hits, queries) in tokens, from its /metrics."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    totals = {"vllm:prefix_cache_hits": 0.0, "vllm:prefix_cache_queries": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals["vllm:prefix_cache_hits"], totals["vllm:prefix_cache_queries"]


async def run(stack: LocalStack, workload: str, args: argparse.Namespace) -> str:
    rng = random.Random(f"{args.seed}/arrivals")
    offsets = [t / args.time_scale for t in poisson_arrivals(args.rate, args.requests, rng, rescaled=True)]
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None), connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        start = time.perf_counter() + 0.2
        sends = (
            _send(session, stack.proxy_url, start + o, p)
            for o, p in zip(offsets, prompts(workload, args.requests, args.seed), strict=True)
        )
        ttfts = await asyncio.gather(*sends)
        counts = [
            await _cache_tokens(session, url)
            for name, url in sorted(stack.engine_urls.items())
            if name.startswith("prefill")
        ]
    served = sorted(1000 * t * args.time_scale for t in ttfts if t is not None)
    hits, queries = sum(h for h, _ in counts), sum(q for _, q in counts)
    split = " / ".join(f"{q / (SHARED + OWN):.0f}" for _, q in counts)
    p50, p90 = served[len(served) // 2], served[min(len(served) - 1, int(0.9 * len(served)))]
    return f"{hits / queries:.0%} | {p50:.0f} / {p90:.0f} | {split} | {args.requests - len(served)}"


async def measure(policy: str, workload: str, args: argparse.Namespace, log_dir: Path) -> str:
    stack = launch(
        LAYOUT,
        QWEN3_235B_MI300X.name,
        args.time_scale,
        log_dir,
        extra_engine_args=("--sim-prefix-cache-blocks", str(args.cache_blocks)),
        extra_proxy_args=("--policy", policy),
    )
    try:
        await stack.wait_ready(timeout_s=60)
        await asyncio.sleep(2.5)  # every engine registered and probed (wait_ready needs only one per role)
        return await run(stack, workload, args)
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=3.0, help="requests per second (model time)")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--cache-blocks", type=int, default=4000, help="prefix-cache blocks per engine")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="prefix-affinity-"))
    _out(f"logs in {log_dir}; {args.requests} requests at {args.rate:g}/s, {args.cache_blocks} cache blocks per engine")
    _out("| workload | policy | prefix-cache hits | TTFT p50 / p90 ms | prefills per engine | failed |")
    _out("|---|---|---|---|---|---|")
    started = time.perf_counter()
    for workload in ("16 system prompts", "no shared prefix", "one system prompt"):
        for policy in POLICIES:
            path = log_dir / f"{policy}-{workload.split()[0]}"
            _out(f"| {workload} | {policy} | " + asyncio.run(measure(policy, workload, args, path)) + " |")
    _out(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
