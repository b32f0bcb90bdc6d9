"""Real processes (`pdctl proxy` + simulated engines): what a failure strands on the engines is released.

The proxy aborts a leg the way vLLM understands, by closing its HTTP connection; the simulated engine
races each request with its connection as vLLM's API server does and frees the request's KV blocks. After
the request's deadline passes, before decode's KV came and in the middle of a stream, the decode engine
is left with nothing running, waiting or held (docs/proxy.md, "Failure contract").
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, until_metric

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
BODY = {"model": "sim-model", "prompt": "a question", "max_tokens": 4000, "ignore_eos": True}


async def _start(stacks: list[LocalStack], path: Path, profile: str, engine: tuple[str, ...]) -> LocalStack:
    stack = launch(
        Topology("write", prefill=SHAPE, decode=SHAPE), profile, 1.0, path, engine, ("--response-timeout", "4")
    )
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    return stack


async def _decode_released(session: aiohttp.ClientSession, stack: LocalStack) -> str:
    url = stack.engine_urls["decode"]
    await until_metric(session, url, "vllm:num_requests_running", 0)
    await until_metric(session, url, "pd_sim_requests_waiting_for_kv", 0)
    return await until_metric(session, url, "vllm:kv_cache_usage_perc", 0)


async def test_the_deadline_before_the_kv_came_releases_decode(stacks: list[LocalStack], tmp_path: Path) -> None:
    """Every notify is dropped, so decode waits for KV that never comes; the request's 4 s deadline comes
    before the 95 s kv wait: 504, and decode, told by its closed connection, holds nothing."""
    stack = await _start(stacks, tmp_path, "instant", ("--sim-drop-notify", "1"))
    async with aiohttp.ClientSession() as session:
        async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
            status, body = resp.status, await resp.json()
        assert status == 504 and body["error"]["code"] == "deadline_exceeded", body
        decode = await _decode_released(session, stack)
    assert metric(decode, "vllm:num_requests_running") == 0 and metric(decode, "vllm:kv_cache_usage_perc") == 0


async def test_the_deadline_mid_stream_ends_it_in_band_and_releases_decode(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    """A 4000-token answer at the calibrated profile's pace (tens of ms a token) is still streaming at the
    4 s deadline: the tokens so far, one error event, ``[DONE]``; decode holds nothing afterwards."""
    stack = await _start(stacks, tmp_path, "qwen3-235b-mi300x", ())
    async with aiohttp.ClientSession() as session:
        async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
            assert resp.status == 200
            events = [e.removeprefix("data: ") for e in (await resp.text()).split("\n\n") if e]
        assert events[-1] == "[DONE]" and "choices" in json.loads(events[0]), events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded", events[-3:]
        decode = await _decode_released(session, stack)
    assert metric(decode, "vllm:num_requests_running") == 0 and metric(decode, "vllm:kv_cache_usage_perc") == 0
