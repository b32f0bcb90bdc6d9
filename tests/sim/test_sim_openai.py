"""Request parsing and response shapes (vLLM's)."""

from __future__ import annotations

from typing import Any

import pytest

from pd_runtime.sim import openai


def parse(body: dict[str, Any], chat: bool = False, max_len: int = 4096) -> openai.GenerationRequest:
    return openai.parse_request(body, chat, max_len)


def test_token_id_prompts_count_exactly() -> None:
    assert parse({"prompt": list(range(2000)), "max_tokens": 10}).prompt_tokens == 2000
    assert parse({"prompt": [list(range(7))]}).prompt_tokens == 7


def test_text_prompts_are_approximated() -> None:
    assert openai.count_text_tokens("hello world") == 2
    assert openai.count_text_tokens("" + " hello" * 100) == 100
    assert openai.count_text_tokens("12345678, ok!") == 3 + 1 + 1 + 1
    assert openai.count_text_tokens("internationalization") == 3


def test_chat_counts_template_overhead() -> None:
    req = parse({"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 5}, chat=True)
    assert req.prompt_tokens == openai.CHAT_PROMPT_OVERHEAD + openai.CHAT_MESSAGE_OVERHEAD + 2
    assert req.chat and req.max_tokens == 5


def test_defaults() -> None:
    req = parse({"prompt": "hi"})
    assert req.max_tokens == openai.COMPLETIONS_DEFAULT_MAX_TOKENS
    assert not req.stream and not req.include_usage and not req.ignore_eos
    chat = parse({"messages": [{"role": "user", "content": "hi"}]}, chat=True, max_len=100)
    assert chat.max_tokens == 100 - chat.prompt_tokens
    assert (
        parse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7}, chat=True).max_tokens == 7
    )


def test_stream_options() -> None:
    req = parse({"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}})
    assert req.stream and req.include_usage and not req.continuous_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 5000}, "max_tokens"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "kv_transfer_params": [1]}, "kv_transfer_params"),
        ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ],
)
def test_bad_requests_are_400_with_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.RequestError) as err:
        parse(body)
    assert err.value.status == 400 and err.value.param == param


def test_response_ids_follow_vllm() -> None:
    assert openai.response_id(False, "abc", "") == "cmpl-abc-0"
    assert openai.response_id(True, "abc", "") == "chatcmpl-abc"
    assert openai.response_id(False, "abc", "0a1b2c3d") == "cmpl-abc-0-0a1b2c3d"


def test_completion_bodies() -> None:
    env = openai.Envelope("cmpl-x-0", "m", False, 1)
    body = openai.full_response(env, " a b", "length", 3, 2, {"k": 1})
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " a b"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
    }
    assert body["kv_transfer_params"] == {"k": 1}
    chunk = openai.chunk(env, " a", None, first=True)
    assert chunk["choices"][0] == {
        "index": 0,
        "text": " a",
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
    }
    assert openai.usage_chunk(env, 3, 2)["choices"] == []


def test_chat_bodies() -> None:
    env = openai.Envelope("chatcmpl-x", "m", True, 1)
    assert openai.full_response(env, "hi", "stop", 1, 1, None)["choices"][0]["message"]["content"] == "hi"
    first = openai.chunk(env, " a", None, first=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": " a"}
    assert openai.chunk(env, " b", "length", first=False)["choices"][0]["delta"] == {"content": " b"}


def test_error_body_is_openai_style() -> None:
    assert openai.error_body(400, "bad", "BadRequestError", "prompt") == {
        "error": {"message": "bad", "type": "BadRequestError", "param": "prompt", "code": 400}
    }
