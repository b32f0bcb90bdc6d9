"""The first token ends the request (a stop string or a stop token): decode samples it.

The prefill leg's ``min_tokens: 1`` keeps that token from ending the request on prefill (vLLM masks stop
tokens and skips stop strings until ``min_tokens`` tokens are out), so prefill ends length-capped and sends
its KV, and decode, given the client's stop conditions, stops at its own first token. The client gets what
one engine computing it whole answers, and both engines' gauges return to nothing running, waiting or held.
"""

from __future__ import annotations

import pytest

from live.client import completion_body, generate, post
from live.cluster import Pair, wait_idle

PROMPT = "class HelpFormatter(object):\n    "
SUCCESS = "vllm:request_success_total"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("ending", ["stop", "stop_token_ids"])
def test_first_token_ends_the_request(pair: Pair, ending: str, stream: bool) -> None:
    prompt = f"{PROMPT}{ending} {stream}"
    first = post(pair.prefill.url, "/v1/completions", completion_body(prompt, max_tokens=1)).json()
    first_text = first["choices"][0]["text"]
    first_id = int(first["choices"][0]["logprobs"]["tokens"][0].removeprefix("token_id:"))
    ends = {"stop": [first_text]} if ending == "stop" else {"stop_token_ids": [first_id]}
    body = completion_body(prompt, max_tokens=8, ignore_eos=False, **ends)
    if ending == "stop" and not first_text.strip():
        pytest.skip(f"the first token {first_text!r} is whitespace: not a usable stop string")
    whole = generate(pair.prefill.url, "/v1/completions", body)
    capped = pair.prefill.sample(SUCCESS, finished_reason="length")
    stopped = pair.decode.sample(SUCCESS, finished_reason="stop")
    through = generate(pair.proxy_url, "/v1/completions", body | {"stream": stream})
    assert whole.finish_reason == "stop"
    assert (through.text, through.finish_reason) == (whole.text, whole.finish_reason)
    assert through.token_ids == whole.token_ids
    # prefill's one token did not stop (length-capped: it kept and sent the KV); decode stopped at its first.
    assert pair.prefill.sample(SUCCESS, finished_reason="length") == capped + 1
    assert pair.decode.sample(SUCCESS, finished_reason="stop") == stopped + 1
    wait_idle(pair)
