"""Real processes (`pdctl proxy --disaggregation threshold` + simulated engines of vLLM 0.33, whose decode
computes a plain request itself): a short prompt is computed on decode alone, a long one is prefilled and
its KV transferred (docs/proxy.md, "Selective disaggregation")."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape, until_metric

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
SHORT, LONG = 20, 100


async def test_a_short_prompt_is_computed_on_decode_and_a_long_one_is_transferred(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    stack = launch(
        Topology("read", prefill=SHAPE, decode=SHAPE),
        "instant",
        1.0,
        tmp_path,
        extra_engine_args=("--vllm-version", "0.33.0"),
        extra_proxy_args=("--disaggregation", "threshold", "--disaggregation-threshold", "64"),
    )
    stacks.append(stack)
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        for length in (SHORT, LONG):
            body = {"model": "sim-model", "prompt": list(range(1000, 1000 + length)), "max_tokens": 4}
            async with session.post(stack.proxy_url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
        decode = await until_metric(session, stack.engine_urls["decode"], "vllm:request_success_total", 2)
        prefill = await until_metric(session, stack.engine_urls["prefill"], "vllm:request_success_total", 1)
        proxy = await scrape(session, stack.admin_url)
    assert metric(prefill, "vllm:prompt_tokens_total") == LONG  # the short prompt never reached prefill
    assert metric(decode, "vllm:prompt_tokens_by_source_total", source="local_compute") == SHORT + 1
    assert metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == LONG - 1
    assert metric(decode, "pd_sim_requests_decoded_without_kv_total") == 0
    assert metric(proxy, "pd_proxy_disaggregation_total", reason="short_prompt") == 1
    assert metric(proxy, "pd_proxy_disaggregation_total", reason="disaggregated") == 1
