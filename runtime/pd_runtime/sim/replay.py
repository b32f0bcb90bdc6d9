"""Replay the seed article's workload against a live local stack, in scaled time.

The client sends the seed's 100 requests (2000 token ids each, max_tokens 1000, no ignore_eos, like
`vllm bench serve` without --ignore-eos) at the simulation's arrival times divided by the time scale,
and converts what it measures back to model seconds, so results compare directly with ``system``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp

from pd_runtime.sim.engine import output_length
from pd_runtime.sim.openai import KvCache, parse_request
from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.stack import MODEL, launch
from pd_runtime.sim.system import (
    SEED_TOPOLOGIES,
    RequestResult,
    poisson_arrivals,
    seed_workload,
    simulate,
)

REQUESTS = 100
PROMPT_TOKENS = 2000
MAX_TOKENS = 1000


def seed_prompts() -> list[list[int]]:
    """Distinct prompts of exactly 2000 token ids (distinct, so EOS falls differently in each)."""
    return [[1000 + (i * 7919 + j) % 16000 for j in range(PROMPT_TOKENS)] for i in range(REQUESTS)]


def engine_lengths(profile: Profile, prompts: list[list[int]]) -> list[int]:
    """The output length the simulated engine will draw for each prompt (its EOS rule)."""
    requests = (parse_request({"prompt": p, "max_tokens": MAX_TOKENS}, False, 16384) for p in prompts)
    return [output_length(r, profile, KvCache.of_prompt(r.prompt_ids))[0] for r in requests]


def simulated_twin(profile: Profile, name: str, rate: float, seed: int) -> list[RequestResult]:
    """The discrete-event simulation of exactly what ``replay`` sends (same arrivals, same EOS)."""
    workload = seed_workload(rate, seed)
    return simulate(profile, SEED_TOPOLOGIES[name], workload, engine_lengths(profile, seed_prompts()))


async def _send(
    session: aiohttp.ClientSession, url: str, start: float, offset: float, prompt: list[int], times: list[float]
) -> None:
    """One streamed request; ``times`` gets the send time, then each content chunk's arrival."""
    await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
    times.append(time.perf_counter())
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with session.post(url + "/v1/completions", json=body) as resp:
        buffer = b""
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            times.extend(now for e in events if e.startswith(b"data: {") and b'"text":"' in e and b'"text":""' not in e)


async def replay(url: str, rate: float, scale: float, seed: int) -> list[RequestResult]:
    rng = random.Random(f"{seed}/{rate!r}")
    offsets = [t / scale for t in poisson_arrivals(rate, REQUESTS, rng, rescaled=True)]
    samples: list[list[float]] = [[] for _ in offsets]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), connector=connector) as session:
        start = time.perf_counter() + 0.2
        sends = (_send(session, url, start, o, p, s) for o, p, s in zip(offsets, seed_prompts(), samples, strict=True))
        await asyncio.gather(*sends)
    return [RequestResult(arrival=s[0] * scale, token_times=[t * scale for t in s[1:]]) for s in samples]


async def replay_config(
    profile: Profile, name: str, rate: float, scale: float, seed: int, log_dir: Path
) -> list[RequestResult]:
    """Launch one of the seed's configurations as real processes, replay, stop."""
    stack = launch(SEED_TOPOLOGIES[name], profile.name, scale, log_dir / name)
    try:
        await stack.wait_ready(timeout_s=60)
        return await replay(stack.proxy_url, rate, scale, seed)
    finally:
        stack.stop()
