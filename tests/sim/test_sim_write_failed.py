"""vLLM 0.33's ``write_failed`` through the proxy, as real processes (`pdctl proxy` + simulated engines).

Prefill drops every notify it receives, so decode's block list never reaches it: prefill gives up after
``defer_timeout`` (2 s here: 60 model seconds at ``--time-scale 30``). From vLLM 0.33 it tells decode,
which fails the request at once (``kv_load_failure_policy: fail``) or computes it itself (``recompute``);
before 0.33 decode waits until the proxy's kv wait aborts it. The proxy's kv wait is ``defer_timeout`` +
1 s, so a ``kv_load_failed`` answer (rather than the kv wait's ``kv_transfer_timeout``) is itself the
proof that the client heard within a second past ``defer_timeout``: the proxy's own deadline bounds it, not
a test clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
TIME_SCALE = 30.0
DEFER_WALL_S = 60 / TIME_SCALE  # the connector's default defer_timeout, 60 model seconds
BODY = {"model": "sim-model", "prompt": [11, 12, 13, 14, 15], "max_tokens": 6, "return_token_ids": True}


async def _stack(stacks: list[LocalStack], path: Path, version: str, policy: str) -> LocalStack:
    stack = launch(
        Topology("write", prefill=SHAPE, decode=SHAPE),
        "instant",
        TIME_SCALE,
        path,
        extra_engine_args=("--vllm-version", version),
        extra_proxy_args=("--kv-wait-timeout", str(DEFER_WALL_S + 1)),
        role_args={"prefill": ("--sim-drop-notify", "1")},
        kv_transfer_keys={"kv_load_failure_policy": policy},
    )
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    return stack


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(url + "/v1/completions", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("stream", [True, False])
async def test_write_failed_is_a_clear_error_within_a_second_of_defer_timeout(
    stacks: list[LocalStack], tmp_path: Path, stream: bool
) -> None:
    stack = await _stack(stacks, tmp_path, "0.33.0", "fail")
    async with aiohttp.ClientSession() as session:
        if stream:
            async with session.post(stack.proxy_url + "/v1/completions", json={**BODY, "stream": True}) as resp:
                status, body = resp.status, await resp.json()
        else:
            status, body = await _post(session, stack.proxy_url, BODY)
        proxy = await scrape(session, stack.admin_url)
        decode = await scrape(session, stack.engine_urls["decode"])
        prefill = await scrape(session, stack.engine_urls["prefill"])
    assert status == 502 and body["error"]["code"] == "kv_load_failed", body
    assert "write_failed" in body["error"]["message"]
    assert metric(proxy, "pd_proxy_kv_load_failures_total") == 1
    assert metric(proxy, "pd_proxy_upstream_errors_total", kind="kv_timeout") == 0
    assert metric(prefill, "pd_sim_kv_notify_messages_total", direction="sent", type="write_failed") == 1
    assert metric(prefill, "pd_sim_kv_transfers_total", outcome="expired") == 1
    assert metric(decode, "pd_sim_requests_waiting_for_kv") == 0


async def test_before_0_33_decode_waits_for_the_kv_wait(stacks: list[LocalStack], tmp_path: Path) -> None:
    """The same fault on 0.31: prefill tells nobody, the proxy's kv wait ends the request (502 kv_transfer_timeout)."""
    stack = await _stack(stacks, tmp_path, "0.31.0", "fail")
    async with aiohttp.ClientSession() as session:
        status, body = await _post(session, stack.proxy_url, {**BODY, "stream": True})
        proxy = await scrape(session, stack.admin_url)
        prefill = await scrape(session, stack.engine_urls["prefill"])
    assert status == 502 and body["error"]["code"] == "kv_transfer_timeout", body
    assert metric(proxy, "pd_proxy_kv_load_failures_total") == 0
    assert metric(prefill, "pd_sim_kv_notify_messages_total", direction="sent", type="write_failed") == 0


async def test_recompute_serves_the_request_on_decode(stacks: list[LocalStack], tmp_path: Path) -> None:
    """``recompute``: decode computes the prompt itself; the client gets the tokens one engine computes."""
    stack = await _stack(stacks, tmp_path, "0.33.0", "recompute")
    async with aiohttp.ClientSession() as session:
        status, body = await _post(session, stack.proxy_url, BODY)
        _, plain = await _post(session, stack.engine_urls["prefill"], BODY)  # computed whole on one engine
        decode = await scrape(session, stack.engine_urls["decode"])
        proxy = await scrape(session, stack.admin_url)
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert metric(decode, "vllm:prompt_tokens_by_source_total", source="local_compute") == len(BODY["prompt"])
    assert metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert metric(proxy, "pd_proxy_kv_load_failures_total") == 0


@pytest.mark.parametrize(("version", "served"), [("0.31.0", False), ("0.33.0", True)])
async def test_write_mode_between_tp2_prefill_and_tp4_decode(
    stacks: list[LocalStack], tmp_path: Path, version: str, served: bool
) -> None:
    """0.33's fan-out write (moriio_tp_mapping.py): each of P's two ranks writes two of D's four, and D
    has its KV once all four ranks heard write_done. Before 0.33 no KV reaches a mixed-TP decode."""
    topology = Topology("write", prefill=EngineShape(tp=2, max_num_seqs=8), decode=EngineShape(tp=4, max_num_seqs=8))
    stack = launch(topology, "instant", 1.0, tmp_path, ("--vllm-version", version), ("--kv-wait-timeout", "2"))
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        status, body = await _post(session, stack.proxy_url, BODY)
        decode = await scrape(session, stack.engine_urls["decode"])
    if served:
        assert status == 200, body
        assert metric(decode, "pd_sim_kv_notify_messages_total", direction="received", type="write_done") == 4
    else:
        assert status == 502 and body["error"]["code"] == "kv_transfer_timeout", body
