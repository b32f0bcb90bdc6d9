"""Requests vLLM refuses come back through the proxy as vLLM's own 4xx, in OpenAI's error form."""

from __future__ import annotations

import pytest

from live.client import completion_body, post
from live.cluster import MAX_MODEL_LEN, Pair, wait_idle

MODES = ["write"]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param({"prompt": "word " * (MAX_MODEL_LEN + 50)}, id="prompt-longer-than-max-model-len"),
        pytest.param({"temperature": -1}, id="negative-temperature"),
        pytest.param({"top_p": 7}, id="top_p-above-1"),
        pytest.param({"logprobs": 10_000}, id="too-many-logprobs"),
    ],
)
def test_refusal_is_vllms_4xx(pair: Pair, case: dict[str, object]) -> None:
    body = completion_body("Hello", max_tokens=4) | case
    direct = post(pair.prefill.url, "/v1/completions", body)
    through = post(pair.proxy_url, "/v1/completions", body)
    assert 400 <= direct.status_code < 500, direct.text
    assert through.status_code == direct.status_code, through.text
    error = through.json()["error"]
    assert {"message", "type", "code"} <= set(error), error
    # vLLM's own message; its first sentence only, as the proxy's prefill leg asks for one token
    # (max_tokens=1), which vLLM's length refusal quotes back ("you requested 1 output tokens").
    assert error["message"].split(".")[0] == direct.json()["error"]["message"].split(".")[0], error
    wait_idle(pair)
