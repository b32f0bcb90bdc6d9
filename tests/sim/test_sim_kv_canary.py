"""Greedy tokens that follow from the KV, and the proxy's canary against them (real processes).

A simulated decode engine decodes from the KV it received: intact, its greedy token ids equal the ones the
prefill engine computes for the prompt whole; with ``--sim-corrupt-kv`` (the bytes arrive wrong) they
differ, HTTP 200 all the same, and the proxy's canary reports the mismatch and where it starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pd_runtime.sim import openai
from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
BODY = {"model": "sim-model", "prompt": "Why is the sky blue?", "max_tokens": 6, "return_token_ids": True}


def test_greedy_tokens_follow_from_the_prompt_and_corrupt_kv_changes_every_one() -> None:
    sky, sea = (3923, 374, 279, 13180, 6437), (3923, 374, 279, 9581, 6437)
    kv = openai.KvCache.of_prompt(sky)
    ids = [kv.token_id(i) for i in range(1, 9)]
    assert ids == [openai.KvCache.of_prompt(sky).token_id(i) for i in range(1, 9)]
    assert ids != [openai.KvCache.of_prompt(sea).token_id(i) for i in range(1, 9)]
    assert all(0 <= i < openai.VOCAB_SIZE for i in ids)
    corrupt = openai.KvCache.of_prompt(sky, corrupt=True)
    assert all(corrupt.token_id(i) != kv.token_id(i) for i in range(1, 200))


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        document: dict[str, Any] = await resp.json()
    return document


async def _canary(session: aiohttp.ClientSession, stack: LocalStack) -> dict[str, Any]:
    for _ in range(200):
        async with session.get(stack.admin_url + "/status") as resp:
            canary: dict[str, Any] = (await resp.json())["canary"]
        if canary["kv_match"] is not None:
            return canary
        await asyncio.sleep(0.1)
    raise AssertionError(f"the canary compared nothing: {canary}")


@pytest.mark.parametrize("mode", ["write", "read"])
@pytest.mark.parametrize("corrupt", [False, True], ids=["intact", "corrupt-kv"])
async def test_the_canary_compares_decode_with_prefill(
    stacks: list[LocalStack], tmp_path: Path, mode: str, corrupt: bool
) -> None:
    engine_args = ("--sim-corrupt-kv",) if corrupt else ()
    topology = Topology(mode, prefill=SHAPE, decode=SHAPE)  # type: ignore[arg-type]
    stack = launch(
        topology, "instant", 1.0, tmp_path, extra_engine_args=engine_args, extra_proxy_args=("--canary-interval", "60")
    )
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        through_pd = await _post(session, stack.proxy_url, BODY)
        whole = await _post(session, stack.engine_urls["prefill"], BODY)  # plain: prefill computes it whole
        canary = await _canary(session, stack)
        decode = await scrape(session, stack.engine_urls["decode"])
    assert through_pd["choices"][0]["text"]  # HTTP 200 with text either way
    assert (through_pd["choices"][0]["token_ids"] == whole["choices"][0]["token_ids"]) is not corrupt
    assert metric(decode, "pd_sim_kv_transfers_total", outcome="completed") >= 2  # the KV did move
    assert canary["kv_match"] is not corrupt and canary["ok"] is not corrupt
    if corrupt:
        mismatch = canary["kv_mismatch"]
        assert mismatch["position"] == 0 and mismatch["compared"] == 8
        assert mismatch["expected"] != mismatch["got"]
        assert "KV mismatch" in canary["error"]
    else:
        assert canary["kv_mismatch"] is None and canary["error"] is None
