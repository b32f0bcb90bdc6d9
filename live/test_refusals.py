"""Requests vLLM refuses come back through the proxy as vLLM's own 4xx, in OpenAI's error form.

Each case also names what vLLM itself answers (status, ``param`` and message, read in its code and seen in
this tier; the length refusal changed its words in 0.32), so the simulated engine's refusals are held to
vLLM's words too.
"""

from __future__ import annotations

import pytest

from live.client import completion_body, post
from live.cluster import ENGINE_RELEASE, MAX_MODEL_LEN, Pair, wait_idle
from pd_runtime.vllm_releases import release

MODES = ["write"]


@pytest.mark.parametrize(
    ("case", "param", "message"),
    [
        pytest.param(
            {"prompt": "word " * (MAX_MODEL_LEN + 50)},
            "input_tokens",
            (
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains at "
                f"least {MAX_MODEL_LEN + 1} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={MAX_MODEL_LEN + 1})"
            )
            if release(ENGINE_RELEASE).prompt_limit_is_the_context
            else (
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested 4 output "
                f"tokens and your prompt contains at least {MAX_MODEL_LEN - 3} input tokens, for a total of at "
                f"least {MAX_MODEL_LEN + 1} tokens. Please reduce the length of the input prompt or the number of "
                f"requested output tokens. (parameter=input_tokens, value={MAX_MODEL_LEN - 3})"
            ),
            id="prompt-longer-than-max-model-len",
        ),
        pytest.param(
            {"temperature": -1},
            "temperature",
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
            id="negative-temperature",
        ),
        pytest.param(
            {"top_p": 7}, "top_p", "top_p must be in (0, 1], got 7.0. (parameter=top_p, value=7.0)", id="top_p-above-1"
        ),
        pytest.param(
            {"logprobs": 10_000},
            "logprobs",
            "Requested sample logprobs of 10000, which is greater than max allowed: 20 "
            "(parameter=logprobs, value=10000)",
            id="too-many-logprobs",
        ),
    ],
)
def test_refusal_is_vllms_4xx(pair: Pair, case: dict[str, object], param: str, message: str) -> None:
    body = completion_body("Hello", max_tokens=4) | case
    direct = post(pair.prefill.url, "/v1/completions", body)
    through = post(pair.proxy_url, "/v1/completions", body)
    assert direct.status_code == 400, direct.text
    refusal = direct.json()["error"]
    assert (refusal["type"], refusal["param"], refusal["code"]) == ("BadRequestError", param, 400), refusal
    assert refusal["message"] == message
    assert through.status_code == direct.status_code, through.text
    error = through.json()["error"]
    assert {"message", "type", "code"} <= set(error), error
    # vLLM's own message; its first sentence only, as the proxy's prefill leg asks for one token
    # (max_tokens=1), which vLLM's length refusal quotes back ("you requested 1 output tokens").
    assert error["message"].split(".")[0] == message.split(".")[0], error
    wait_idle(pair)
