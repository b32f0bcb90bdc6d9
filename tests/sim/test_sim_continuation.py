"""The simulated engine continues like a model: a request whose prompt is another's prompt plus the tokens it
had generated goes on with exactly the tokens, the logprobs and the end the undisturbed request had (what a
migrated request relies on, docs/proxy.md "Migration")."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from pd_runtime.sim import openai
from pd_runtime.sim.engine import output_length
from pd_runtime.sim.profiles import INSTANT, QWEN3_235B_MI300X
from tests.ports import TEST_PORTS
from tests.sim.sim_helpers import EngineFactory

pytestmark = pytest.mark.timeout(30)


def parse(body: dict[str, Any]) -> openai.GenerationRequest:
    return openai.parse_request(body, False, 32768)


def test_each_token_follows_from_the_prompt_and_the_tokens_before_it() -> None:
    request = parse({"prompt": "Why is the sky blue?", "max_tokens": 40})
    kv = openai.KvCache.of_prompt(request.prompt_ids)
    tokens = [kv.token_id(i) for i in range(1, 41)]
    for cut in (1, 7, 39):
        resumed = openai.KvCache.of_prompt((*request.prompt_ids, *tokens[:cut]))
        assert [resumed.token_id(i) for i in range(1, 41 - cut)] == tokens[cut:]
        assert resumed.context(1) == kv.context(cut + 1)  # so logprobs continue too
    other = openai.KvCache.of_prompt((*request.prompt_ids, (tokens[0] + 1) % openai.VOCAB_SIZE))
    assert [other.token_id(i) for i in range(1, 10)] != tokens[1:10]  # another context, another answer


def test_a_continuation_ends_where_the_undisturbed_answer_ends() -> None:
    ends = []
    for prompt in range(20):
        request = parse({"prompt": [prompt, 1, 2, 3], "max_tokens": 1000})
        kv = openai.KvCache.of_prompt(request.prompt_ids)
        length, finish = output_length(request, QWEN3_235B_MI300X, kv)
        ends.append(length)
        if length < 3:
            continue  # a continuation's first token is never EOS (docs/simulator.md)
        cut = length // 2
        resumed = parse({"prompt": [*request.prompt_ids, *(kv.token_id(i) for i in range(1, cut + 1))],
                         "max_tokens": 1000 - cut})  # fmt: skip
        resumed_kv = openai.KvCache.of_prompt(resumed.prompt_ids)
        assert output_length(resumed, QWEN3_235B_MI300X, resumed_kv) == (length - cut, finish)
    assert len(set(ends)) > 5 and min(ends) >= 2  # lengths vary by prompt, never one token
    assert output_length(parse({"prompt": [1], "max_tokens": 9}), INSTANT, kv) == (9, "length")


async def test_the_engine_continues_a_token_id_prompt_as_the_model_would(start_engine: EngineFactory) -> None:
    engine = await start_engine(["m", "--port", str(TEST_PORTS.port())])
    body = {"model": "m", "prompt": "Tell me a story", "max_tokens": 12, "return_token_ids": True, "logprobs": 1}
    async with aiohttp.ClientSession() as http:
        async with http.post(engine.url + "/v1/completions", json=body) as resp:
            whole = (await resp.json())["choices"][0]
        prompt, tokens = whole["prompt_token_ids"], whole["token_ids"]
        resumed_body = {**body, "prompt": [*prompt, *tokens[:5]], "max_tokens": 7}
        async with http.post(engine.url + "/v1/completions", json=resumed_body) as resp:
            resumed = (await resp.json())["choices"][0]
    assert resumed["token_ids"] == tokens[5:]
    assert resumed["prompt_token_ids"] == [*prompt, *tokens[:5]]
    assert resumed["logprobs"]["token_logprobs"] == whole["logprobs"]["token_logprobs"][5:]
