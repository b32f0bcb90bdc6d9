"""Real processes (`pdctl proxy` + simulated engines): several engines per role behind one proxy.

Load-aware routing reads every engine's /metrics (vLLM 0.31's gauges) and spreads prefill over both
instances; /status shows each instance's load and how many requests it got.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
BODY = {"model": "sim-model", "prompt": "a question", "max_tokens": 16}


async def start_2p1d(stacks: list[LocalStack], path: Path, *proxy: str, profile: str = "instant") -> LocalStack:
    topology = Topology("write", prefill=SHAPE, decode=EngineShape(tp=1, max_num_seqs=64), prefills=2)
    stack = launch(topology, profile, 10.0, path, extra_proxy_args=("--policy", "least_load", *proxy))
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    return stack


async def status(session: aiohttp.ClientSession, stack: LocalStack) -> dict[str, Any]:
    async with session.get(stack.admin_url + "/status") as resp:
        doc: dict[str, Any] = await resp.json()
        return doc


async def wait_for_prefills(session: aiohttp.ClientSession, stack: LocalStack, count: int) -> None:
    for _ in range(200):
        if (await status(session, stack))["counts"]["prefill"] == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never {count} live prefill instances")


async def completion(session: aiohttp.ClientSession, stack: LocalStack) -> int:
    async with session.post(stack.proxy_url + "/v1/completions", json=BODY) as resp:
        await resp.read()
        return resp.status


async def test_least_load_uses_both_prefill_instances_and_status_shows_their_load(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    stack = await start_2p1d(stacks, tmp_path, "--load-interval", "0.2", profile="qwen3-235b-mi300x")
    async with aiohttp.ClientSession() as session:
        await wait_for_prefills(session, stack, 2)
        statuses = await asyncio.gather(*(completion(session, stack) for _ in range(24)))
        await asyncio.sleep(0.5)  # one more scrape after the burst
        doc = await status(session, stack)
    assert statuses == [200] * 24
    assert doc["policy"] == "least_load"
    prefills = [i for i in doc["instances"] if i["role"] == "P"]
    assert len(prefills) == 2
    routed = sorted(i["routed"] for i in prefills)
    assert routed[0] > 0 and sum(routed) == 24, routed  # both used; the proxy's canary is off here
    for inst in doc["instances"]:
        assert inst["load_age_s"] is not None and inst["load_age_s"] < 30, inst  # scraped every 0.2 s; slack for load
        assert set(inst["load"]["0"]) == {"running", "waiting", "kv_cache_usage"}
        assert inst["in_flight"] == 0


async def timed_stream(session: aiohttp.ClientSession, stack: LocalStack, delay: float) -> tuple[bool, float, float]:
    """One streamed request sent after ``delay``: (served whole, first byte time, end time)."""
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    first = end = 0.0
    try:
        async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
            body = b""
            async for chunk in resp.content.iter_any():
                first = first or loop.time()
                body += chunk
            end = loop.time()
            ok = resp.status == 200 and b'"error"' not in body and body.endswith(b"data: [DONE]\n\n")
            return ok, first, end
    except aiohttp.ClientError:
        return False, first, loop.time()


async def test_a_killed_prefill_loses_at_most_the_requests_that_were_streaming(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    """100 probe requests at 50/s; prefill-0 is SIGKILLed 0.8 s in. Requests on it before their first
    byte are served again on prefill-1 (new transfer, both legs); only a request already streaming could
    be lost, and in write mode those no longer need prefill."""
    stack = await start_2p1d(stacks, tmp_path, profile="qwen3-235b-mi300x")
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        await wait_for_prefills(session, stack, 2)
        probes = [asyncio.create_task(timed_stream(session, stack, i / 50)) for i in range(100)]
        await asyncio.sleep(0.8)
        killed_at = loop.time()
        stack.kill("prefill-0")
        results = await asyncio.gather(*probes)
        doc = await status(session, stack)
        failovers = metric(await scrape(session, stack.admin_url), "pd_proxy_failovers_total", leg="prefill")
    streaming = sum(1 for _, first, end in results if 0 < first < killed_at < end)
    lost = sum(1 for ok, _, _ in results if not ok)
    assert lost <= streaming, f"lost {lost}, streaming at the kill {streaming}"
    assert failovers >= 1  # requests did meet the dead engine, and were served on the other one
    by_port = {i["http_address"]: i for i in doc["instances"]}
    survivor = by_port[stack.engine_urls["prefill-1"].removeprefix("http://")]
    assert survivor["healthy"] is True
    # Out of rotation, or already evicted when a loaded machine read /status past its heartbeat TTL.
    killed = by_port.get(stack.engine_urls["prefill-0"].removeprefix("http://"))
    if killed is not None:
        assert killed["healthy"] is False
        assert survivor["routed"] > killed["routed"] > 0


async def streamed_ids(response: aiohttp.ClientResponse, on_token: Any = None) -> tuple[list[int], list[Any]]:
    """A completion stream's token ids (the client asked for them) and its events; ``on_token(n)`` after each."""
    ids: list[int] = []
    events: list[Any] = []
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *whole, buffer = buffer.split(b"\n\n")
        for event in whole:
            if event == b"data: [DONE]":
                continue
            events.append(json.loads(event.removeprefix(b"data: ")))
            ids += [t for c in events[-1].get("choices") or [] for t in c.get("token_ids") or []]
            if on_token is not None:
                await on_token(len(ids))
    return ids, events


async def test_a_decode_killed_mid_stream_is_migrated_to_the_other_with_the_same_tokens(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    """1P2D, calibrated timing (a token every ~19 ms): the decode engine serving a greedy stream is SIGKILLed
    after 10 tokens; the proxy continues the request on the other decode engine, and the client's token ids
    equal those of the same request undisturbed (docs/proxy.md, "Migration")."""
    topology = Topology("write", prefill=SHAPE, decode=EngineShape(tp=1, max_num_seqs=64), decodes=2)
    stack = launch(topology, "qwen3-235b-mi300x", 2.0, tmp_path)
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    body = {**BODY, "max_tokens": 60, "stream": True, "ignore_eos": True, "temperature": 0,
            "return_token_ids": True, "stream_options": {"include_usage": True}}  # fmt: skip
    killed: list[str] = []

    async def kill_the_streaming_decode(tokens: int) -> None:
        if tokens < 10 or killed:
            return
        serving = [i["http_address"] for i in (await status(session, stack))["instances"] if i["in_flight"]]
        (name,) = [n for n, url in stack.engine_urls.items() if n.startswith("decode") and url[7:] in serving]
        stack.kill(name)
        killed.append(name)

    async with aiohttp.ClientSession() as session:
        for _ in range(200):  # both decode engines routable
            if (await status(session, stack))["counts"]["decode"] == 2:
                break
            await asyncio.sleep(0.1)
        async with session.post(stack.proxy_url + "/v1/completions", json=body) as resp:
            expected, _ = await streamed_ids(resp)
        async with session.post(stack.proxy_url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            got, events = await streamed_ids(resp, kill_the_streaming_decode)
        migrations = metric(await scrape(session, stack.admin_url), "pd_proxy_migrations_total", outcome="ok")
    assert killed and len(expected) == 60
    assert got == expected  # no token twice, none missing, the same greedy tokens
    assert len({e["id"] for e in events}) == 1 and not any("error" in e for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 60
    assert migrations == 1
