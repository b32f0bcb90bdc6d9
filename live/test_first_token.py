"""The first token ends the request (a stop string or a stop token on prefill).

The client gets what one engine computing it whole answers, and no decode request is left waiting for KV
that will never come: vLLM's own gauges on both engines return to nothing running, waiting or held.
"""

from __future__ import annotations

import pytest

from live.client import completion_body, generate, post
from live.cluster import Pair, wait_idle, wait_idle_accepting_decode_leak

PROMPT = "class HelpFormatter(object):\n    "


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
    through = generate(pair.proxy_url, "/v1/completions", body | {"stream": stream})
    assert whole.finish_reason == "stop"
    assert (through.text, through.finish_reason) == (whole.text, whole.finish_reason)
    assert through.token_ids == whole.token_ids
    if pair.mode == "write":
        # Decode's leg, waiting for KV that a finished prefill never sends, is aborted by the proxy: nothing
        # runs or waits after it, but vLLM 0.31's decode may keep that request's blocks (its abort-during-
        # KV-wait leak, asserted in test_faults), which the pair's later tests then accept.
        wait_idle_accepting_decode_leak(pair)
    else:
        wait_idle(pair)
