"""The simulated engine's prefix cache (--sim-prefix-cache-blocks): blocks, LRU, and an engine computing
only the uncached rest of a prompt that begins like an earlier one."""

from __future__ import annotations

import aiohttp
import pytest

from pd_runtime.prefix_cache import PrefixCache, id_blocks
from pd_runtime.sim.openai import parse_request
from tests.ports import TEST_PORTS
from tests.sim.sim_helpers import EngineFactory, metric, scrape

pytestmark = pytest.mark.timeout(30)


def test_blocks_are_full_16_token_blocks_chained_to_what_precedes_them() -> None:
    shared = list(range(32))
    assert len(id_blocks([*shared, 1, 2, 3])) == 2  # the partial third block is not cached
    assert id_blocks([*shared, *range(100, 116)])[:2] == id_blocks(shared)
    assert not set(id_blocks([9, *shared[1:]])) & set(id_blocks(shared))  # a different start: nothing shared


def test_text_and_chat_prompts_have_blocks_too() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 20
    one = parse_request({"prompt": text + "first?", "max_tokens": 1}, False, 4096)
    two = parse_request({"prompt": text + "second!", "max_tokens": 1}, False, 4096)
    assert len(one.prompt_blocks) >= 10 and one.prompt_blocks[:10] == two.prompt_blocks[:10]
    system = {"role": "system", "content": text}
    chat = [parse_request({"messages": [system, {"role": "user", "content": q}]}, True, 4096) for q in "ab"]
    assert chat[0].prompt_blocks[:10] == chat[1].prompt_blocks[:10]


def test_the_least_recently_used_blocks_go_first() -> None:
    cache = PrefixCache(capacity=4)
    cache.store((1, 2))
    cache.store((3, 4))
    assert cache.lookup((1, 2, 9)) == 2  # 1 and 2 used again: 3 and 4 are the oldest now
    cache.store((5, 6))
    assert len(cache) == 4 and cache.lookup((3,)) == 0 and cache.lookup((1, 2, 5, 6)) == 4


async def test_an_engine_computes_only_the_uncached_rest(start_engine: EngineFactory) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "--sim-prefix-cache-blocks", "100"])
    shared = list(range(1000, 1160))  # 10 blocks
    async with aiohttp.ClientSession() as http:
        for own in ([1, 2, 3], [4, 5, 6]):
            body = {"prompt": shared + own, "max_tokens": 1}
            async with http.post(eng.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        text = await scrape(http, eng.url)
    assert [r.cached_tokens for r in eng.engine.records] == [0, 160]
    assert metric(text, "vllm:prefix_cache_queries_total") == 2 * 163
    assert metric(text, "vllm:prefix_cache_hits_total") == 160
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 160
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 2 * 163 - 160
