"""End to end with real processes: `pdctl proxy` + simulated P and D, registered over ZMQ heartbeats.

100 streamed requests per transfer mode; afterwards both engines' metrics must show that every
request's KV handoff went over the ZMQ side channels (remote_blocks/write_done or release).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
REQUESTS = 100
MAX_TOKENS = 8
# Per-rank messages: D and P exchange one notify per TP rank (docs/protocol.md#rank-ports, docs/protocol.md#write-mode).
TP = 2
SHAPE = EngineShape(tp=TP, max_batched_tokens=4096, max_num_seqs=64)


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[list[LocalStack]]:
    started: list[LocalStack] = []
    yield started
    for stack in started:
        stack.stop()


async def _stream(session: aiohttp.ClientSession, url: str, index: int) -> tuple[int, int]:
    body = {
        "model": "sim-model",
        "prompt": [1000 + (index + i) % 5000 for i in range(64)],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens, usage = 0, -1
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for event in map(json.loads, events[:-1]):
        assert "error" not in event, event
        tokens += sum(1 for c in event["choices"] if c.get("text"))
        if event.get("usage"):
            usage = event["usage"]["completion_tokens"]
    return tokens, usage


@pytest.mark.parametrize("mode", ["write", "read"])
async def test_proxy_and_simulated_pd_pair(stacks: list[LocalStack], tmp_path: Path, mode: str) -> None:
    topology = Topology(mode, prefill=SHAPE, decode=SHAPE)  # type: ignore[arg-type]
    stack = launch(topology, profile="instant", time_scale=1.0, log_dir=tmp_path / mode)
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(_stream(session, stack.proxy_url, i) for i in range(REQUESTS)))
        assert all(tokens == MAX_TOKENS and usage == MAX_TOKENS for tokens, usage in results), results[:3]
        await asyncio.sleep(0.3)  # the producer sends write_done just after D's last token may have gone out
        p = await scrape(session, stack.engine_urls["prefill"])
        d = await scrape(session, stack.engine_urls["decode"])
        async with session.get(stack.admin_url + "/status") as resp:
            status = await resp.json()
    assert metric(p, "pd_sim_kv_transfers_total", outcome="completed") == REQUESTS
    assert metric(d, "pd_sim_kv_transfers_total", outcome="completed") == REQUESTS
    assert metric(p, "pd_sim_kv_blocks_held") == 0
    if mode == "write":
        assert metric(d, "pd_sim_kv_notify_messages_total", direction="sent", type="remote_blocks") == REQUESTS * TP
        assert metric(p, "pd_sim_kv_notify_messages_total", direction="received", type="remote_blocks") == REQUESTS * TP
        assert metric(p, "pd_sim_kv_notify_messages_total", direction="sent", type="write_done") == REQUESTS * TP
        assert metric(d, "pd_sim_kv_notify_messages_total", direction="received", type="write_done") == REQUESTS * TP
        assert metric(p, "pd_sim_kv_handshakes_total", direction="outbound") >= 1
    else:
        assert metric(d, "pd_sim_kv_notify_messages_total", direction="sent", type="release") == REQUESTS * TP
        assert metric(p, "pd_sim_kv_notify_messages_total", direction="received", type="release") == REQUESTS * TP
        assert metric(d, "pd_sim_kv_handshakes_total", direction="outbound") >= 1
    # vLLM's own metric names, counted on the engine that served each part
    assert metric(p, "vllm:request_success_total") == REQUESTS
    assert metric(d, "vllm:generation_tokens_total") == REQUESTS * MAX_TOKENS
    assert {i["role"] for i in status["instances"]} == {"P", "D"}
    assert status["last_transfer"] is not None
