"""Greedy output through P->D equals one engine computing the request whole, in write and read mode.

The oracle is the prefill engine itself answering a plain request (no kv_transfer_params): the same weights,
dtype, kernels and settings as both legs (the rendered command lines disable prefix caching, so the plain
request computes its prompt afresh). The decode engine computed no prompt token itself in write mode, and
only the last one in read mode ("READ mode always recomputes the last token locally on the decoder",
MoRIIOConnectorScheduler.get_num_new_matched_tokens, vLLM 0.31): vLLM's own
``vllm:prompt_tokens_by_source_total`` says the others came by external KV transfer.
"""

from __future__ import annotations

import pytest

from live.client import chat_body, completion_body, generate
from live.cluster import Faults, Pair

# Prompt tokens the decode engine computes itself, per transfer mode.
DECODE_COMPUTES = {"write": 0, "read": 1}
PROMPT = "def parse_args(self, args=None, namespace=None):\n    "


def _prompt_sources(pair: Pair) -> dict[str, float]:
    return {
        source: pair.decode.sample("vllm:prompt_tokens_by_source_total", source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_output_equals_one_engine_computing_it_whole(pair: Pair, endpoint: str, stream: bool) -> None:
    path, body = (
        ("/v1/completions", completion_body(PROMPT + endpoint))
        if endpoint == "completions"
        else ("/v1/chat/completions", chat_body(PROMPT + endpoint))
    )
    whole = generate(pair.prefill.url, path, body)
    before = _prompt_sources(pair)
    transfers = len(pair.faults.transfers())
    through = generate(pair.proxy_url, path, body | {"stream": stream})
    after = _prompt_sources(pair)
    assert len(whole.token_ids) == body["max_tokens"]
    assert through.token_ids == whole.token_ids
    assert through.logprobs == whole.logprobs
    assert through.text == whole.text
    assert len(pair.faults.transfers()) > transfers, "no KV moved through the mori.io stand-in"
    computed = {k: after[k] - before[k] for k in after}
    assert whole.prompt_tokens is not None
    local = DECODE_COMPUTES[pair.mode]
    assert computed == {
        "local_compute": local,
        "local_cache_hit": 0,
        "external_kv_transfer": whole.prompt_tokens - local,
    }


def test_corrupted_kv_changes_the_output(pair: Pair, faults: Faults) -> None:
    """The comparison above can fail: KV bytes replaced by zeros in transit change the tokens."""
    body = completion_body(PROMPT + "corrupt")
    whole = generate(pair.prefill.url, "/v1/completions", body)
    faults.set("corrupt")
    through = generate(pair.proxy_url, "/v1/completions", body)
    assert [t["fault"] for t in faults.transfers()][-1] == "corrupt"
    assert (through.token_ids, through.logprobs) != (whole.token_ids, whole.logprobs)
