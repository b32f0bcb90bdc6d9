"""Pure: request bodies with an exact prompt length and output length.

Exact prompt length without a tokenizer: on /v1/completions the prompt is a list of token ids (vLLM
accepts ``list[int]``), so its length is exact by construction. The ids come from a band that is
ordinary text in common vocabularies (GPT-2, Llama, Qwen, Mistral: ids 1000..16999), and each request
starts at a random place in the band so requests do not share a cached prefix. The chat endpoint
takes text only, so there the length is approximate (a random number, then a repeated one-token
word); the server's
``usage.prompt_tokens`` is recorded either way.
"""

from __future__ import annotations

import json
import random
from typing import Any

from pd_runtime.openai_api import Endpoint

TOKEN_ID_BASE = 1000
TOKEN_ID_SPAN = 16000
CHAT_WORD = " hello"


def prompt_token_ids(length: int, rng: random.Random) -> list[int]:
    start = rng.randrange(TOKEN_ID_SPAN)
    return [TOKEN_ID_BASE + (start + i) % TOKEN_ID_SPAN for i in range(length)]


def request_body(
    endpoint: Endpoint,
    model: str,
    prompt_tokens: int,
    output_tokens: int,
    rng: random.Random,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """A streaming request with usage reported: exactly ``output_tokens`` tokens with ``ignore_eos``,
    else at most that many (the model may stop at EOS, as in workloads of natural replies)."""
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": output_tokens,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint is Endpoint.COMPLETIONS:
        return {**common, "prompt": prompt_token_ids(prompt_tokens, rng)}
    text = f"{rng.randrange(1_000_000)}:{CHAT_WORD * max(prompt_tokens - 1, 0)}"
    return {**common, "messages": [{"role": "user", "content": text}]}


def encode_body(body: dict[str, Any]) -> bytes:
    """Serialised ahead of the stage so that sending costs no JSON encoding on the hot path."""
    return json.dumps(body, separators=(",", ":")).encode()
