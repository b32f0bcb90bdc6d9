"""Request bodies: prompts of exact length on completions, text on chat."""

from __future__ import annotations

import random

from pd_runtime.openai_api import Endpoint
from pd_runtime.workload.payload import request_body


def test_completions_body_has_exact_prompt_and_output_length() -> None:
    body = request_body(Endpoint.COMPLETIONS, "m", 2000, 1000, random.Random(0))
    assert len(body["prompt"]) == 2000 and all(isinstance(t, int) for t in body["prompt"])
    assert body["max_tokens"] == 1000 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_body_is_text() -> None:
    body = request_body(Endpoint.CHAT, "m", 50, 10, random.Random(0))
    assert isinstance(body["messages"][0]["content"], str)
    assert body["max_tokens"] == 10 and body["ignore_eos"] is True
