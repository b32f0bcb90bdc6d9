"""Real processes (`pdctl proxy` + simulated engines at the image's vLLM version, 0.29): a first token
that is EOS is decode's to sample, requests whose KV never reaches decode end cleanly, and the decode
engine is left with no request waiting for KV.

On vLLM 0.29 a decode engine treats every request as a remote prefill, so a plain request sent there
waits for KV forever; the simulator reproduces that, which is what makes these tests able to fail.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
BODY = {"model": "sim-model", "prompt": "a question", "max_tokens": 8}


async def _start(
    stacks: list[LocalStack], path: Path, mode: str, engine: tuple[str, ...], proxy: tuple[str, ...]
) -> LocalStack:
    topology = Topology(mode, prefill=SHAPE, decode=SHAPE)  # type: ignore[arg-type]
    stack = launch(topology, "instant", 1.0, path, extra_engine_args=engine, extra_proxy_args=proxy)
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    return stack


async def _decode_metrics_once_idle(session: aiohttp.ClientSession, url: str, answered: int = 0) -> str:
    """Decode's metrics once no request waits for KV and at least `answered` requests are counted as
    finished, or after 60 s: an aborted leg leaves the engine when it sees the closed connection, and a
    finished one is counted after its last byte, a moment after the proxy answered (longer on a loaded
    machine)."""
    deadline = time.monotonic() + 60
    while True:
        text = await scrape(session, url)
        idle = metric(text, "pd_sim_requests_waiting_for_kv") == 0
        if idle and metric(text, "vllm:request_success_total", finished_reason="stop") >= answered:
            return text
        if time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["write", "read"])
async def test_an_eos_first_token_is_sampled_by_decode(stacks: list[LocalStack], tmp_path: Path, mode: str) -> None:
    """Every prompt's first token is EOS: the prefill leg's ``min_tokens: 1`` masks it, so prefill ends
    length-capped with KV, and decode samples the EOS itself (vLLM 0.29's decode would hang on a plain request)."""
    stack = await _start(stacks, tmp_path, mode, ("--sim-eos-first-token",), ("--response-timeout", "20"))
    async with aiohttp.ClientSession() as session:
        async with session.post(stack.proxy_url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
            assert resp.status == 200
            events = (await resp.read()).decode().split("\n\n")
        decode = await _decode_metrics_once_idle(session, stack.engine_urls["decode"], answered=2)
        async with session.get(stack.admin_url + "/metrics") as resp:
            proxy = await resp.text()
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 1
    chunk = json.loads(events[0].removeprefix("data: "))
    assert chunk["choices"][0]["finish_reason"] == "stop" and events[-2] == "data: [DONE]"
    assert metric(decode, "vllm:request_success_total", finished_reason="stop") == 2  # decode answered both
    assert metric(decode, "pd_sim_requests_waiting_for_kv") == 0
    assert metric(decode, "pd_sim_requests_decoded_without_kv_total") == 0
    assert metric(proxy, "pd_proxy_no_kv_total") == 0


async def test_a_transfer_that_never_completes_ends_with_a_kv_transfer_error_and_leaves_decode_idle(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    """Every notify is dropped, so prefill never writes and decode never gets its KV."""
    stack = await _start(stacks, tmp_path, "write", ("--sim-drop-notify", "1"), ("--kv-wait-timeout", "1"))
    async with aiohttp.ClientSession() as session:
        async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
            status, body = resp.status, await resp.json()
        decode = await _decode_metrics_once_idle(session, stack.engine_urls["decode"])
        async with session.get(stack.admin_url + "/metrics") as resp:
            proxy = await resp.text()
    # the 1 s kv wait ended it, not the first-byte bound (300 s, a 502 decode_failed)
    assert status == 502 and body["error"]["code"] == "kv_transfer_timeout"
    assert metric(decode, "pd_sim_requests_waiting_for_kv") == 0
    assert metric(proxy, "pd_proxy_upstream_errors_total", leg="decode", kind="kv_timeout") == 1
