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
        ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, None),
    ],
)
def test_bad_requests_are_400_with_the_param(body: dict[str, Any], param: str | None) -> None:
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
    first = openai.chunk(env, "", None, first=True)  # vLLM's role-only opening chunk
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert openai.chunk(env, " b", "length", first=False)["choices"][0]["delta"] == {"content": " b"}


def test_error_body_is_openai_style() -> None:
    assert openai.error_body(400, "bad", "BadRequestError", "prompt") == {
        "error": {"message": "bad", "type": "BadRequestError", "param": "prompt", "code": 400}
    }


@pytest.mark.parametrize(
    ("body", "chat", "message"),
    [
        ({"temperature": -1}, False, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"),
        ({"temperature": 3}, False, "temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)"),
        ({"top_p": 7}, False, "top_p must be in (0, 1], got 7.0. (parameter=top_p, value=7.0)"),
        (
            {"logprobs": 10_000},
            False,
            "Requested sample logprobs of 10000, which is greater than max allowed: 20 "
            "(parameter=logprobs, value=10000)",
        ),
        ({"logprobs": -2}, False, "`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)"),
        (
            {"logprobs": True, "top_logprobs": 50},
            True,
            "Requested sample logprobs of 50, which is greater than max allowed: 20 (parameter=logprobs, value=50)",
        ),
        (
            {"top_logprobs": 2},
            True,
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        ),
    ],
)
def test_sampling_refusals_are_vllms(body: dict[str, Any], chat: bool, message: str) -> None:
    """vLLM 0.31's messages (SamplingParams._verify_args, the protocols' check_logprobs), live/test_refusals.py."""
    base = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    with pytest.raises(openai.RequestError) as err:
        parse(base | {"max_tokens": 4} | body, chat=chat)
    assert (err.value.status, err.value.err_type, err.value.message) == (400, "BadRequestError", message)


def test_context_length_refusal_is_vllms() -> None:
    """A text prompt is counted as vLLM counts it: tokenized up to one past the limit, "at least"."""
    with pytest.raises(openai.RequestError) as err:
        parse({"prompt": "word " * 562, "max_tokens": 4}, max_len=512)
    assert err.value.param == "input_tokens"
    assert err.value.message == (
        "This model's maximum context length is 512 tokens. However, you requested 4 output tokens and your "
        "prompt contains at least 509 input tokens, for a total of at least 513 tokens. Please reduce the length "
        "of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=509)"
    )
    with pytest.raises(openai.RequestError) as err:
        parse({"prompt": list(range(600)), "max_tokens": 4}, max_len=512)
    assert "your prompt contains 600 input tokens, for a total of 604 tokens" in err.value.message


def test_logprobs_follow_the_token_and_its_context() -> None:
    req = parse({"prompt": "hi", "logprobs": 2, "return_tokens_as_token_ids": True})
    kv = openai.KvCache.of_prompt(req.prompt_ids)
    tokens = [(kv.context(i), kv.token_id(i)) for i in (1, 2)]
    body = openai.logprobs_body(req, tokens)
    assert body is not None
    assert body["tokens"] == [f"token_id:{t}" for _, t in tokens]
    assert body["token_logprobs"] == [openai.token_logprob(t, c) for c, t in tokens]
    assert all(lp <= 0 for lp in body["token_logprobs"])
    assert [len(top) for top in body["top_logprobs"]] == [2, 2]
    assert body["text_offset"][0] == 0
    corrupt = openai.KvCache.of_prompt(req.prompt_ids, corrupt=True)
    assert openai.token_logprob(corrupt.token_id(1), corrupt.context(1)) != body["token_logprobs"][0]
    assert openai.logprobs_body(parse({"prompt": "hi"}), tokens) is None
    chat = parse({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, chat=True)
    (entry,) = (openai.logprobs_body(chat, tokens[:1]) or {})["content"]
    assert entry["token"] == openai.token_text(tokens[0][1]) and entry["top_logprobs"] == []


def test_stops_end_the_output_as_vllm_does() -> None:
    req = parse({"prompt": "hi", "max_tokens": 8})
    kv = openai.KvCache.of_prompt(req.prompt_ids)
    first, second = kv.token_id(1), kv.token_id(2)
    words = [openai.token_text(first), openai.token_text(second)]
    stop_ids = parse({"prompt": "hi", "max_tokens": 8, "stop_token_ids": [second]})
    assert openai.stopped_output(stop_ids, kv, 8, "length") == openai.Stopped(2, "stop", (words[0], ""), second)
    # A stop string spanning both tokens: the text ends where it begins (vLLM 0.31, seen in the live tier).
    both = parse({"prompt": "hi", "max_tokens": 8, "stop": ["".join(words)]})
    assert openai.stopped_output(both, kv, 8, "length") == openai.Stopped(2, "stop", ("", ""), "".join(words))
    assert openai.stopped_output(req, kv, 8, "length") == openai.Stopped(8, "length")
    # Not before min_tokens (the proxy's prefill leg asks for 1).
    capped = parse({"prompt": "hi", "max_tokens": 8, "min_tokens": 1, "stop_token_ids": [first]})
    assert openai.stopped_output(capped, kv, 8, "length").length > 1 or first == second
    with pytest.raises(openai.RequestError):
        parse({"prompt": "hi", "stop": [""]})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2."),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ({"min_tokens": 9}, "min_tokens must be less than or equal to max_tokens=4, got 9."),
        ({"top_k": -5}, "top_k must be 0 (disable), or at least 1, got -5."),
        ({"presence_penalty": 5}, "presence_penalty must be in [-2, 2], got 5.0."),
    ],
)
def test_other_refusals_are_vllms(body: dict[str, Any], message: str) -> None:
    """What vLLM 0.31 answered in the live tier to the same bodies (max_tokens 4 unless given)."""
    with pytest.raises(openai.RequestError) as err:
        parse({"prompt": "hi", "max_tokens": 4} | body)
    assert err.value.message == message
