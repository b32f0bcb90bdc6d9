"""A request that is not streamed, served from decode's stream: the whole answer vLLM would have sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_runtime.proxy.legs import ClientRequest, streams_whole
from pd_runtime.proxy.relay import opens_answer, stream_chunks, whole_from_stream


def _events(*chunks: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


HEAD = {"id": "cmpl-u-0-ab", "created": 1700000000, "model": "m"}
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}

# vLLM 0.31's stream chunks (CompletionStreamResponse, ChatCompletionStreamResponse) with logprobs,
# return_token_ids and stream_options.include_usage
COMPLETION = _events(
    {**HEAD, "object": "text_completion", "choices": [{
        "index": 0, "text": " a", "finish_reason": None, "stop_reason": None, "prompt_token_ids": [1, 2],
        "token_ids": [7], "logprobs": {"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["token_id:7"],
                                        "top_logprobs": [{"token_id:7": -0.5}]}}]},
    {**HEAD, "object": "text_completion", "choices": [{
        "index": 0, "text": " b", "finish_reason": "length", "stop_reason": None, "token_ids": [8],
        "logprobs": {"text_offset": [2], "token_logprobs": [-1.5], "tokens": ["token_id:8"],
                     "top_logprobs": [{"token_id:8": -1.5}]}}]},
    {**HEAD, "object": "text_completion", "choices": [], "usage": USAGE},
)  # fmt: skip
CHAT = _events(
    {**HEAD, "object": "chat.completion.chunk", "prompt_token_ids": [1, 2], "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]},
    {**HEAD, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None, "token_ids": [7],
         "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}]},
    {**HEAD, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "!"}, "finish_reason": "stop", "stop_reason": 9, "token_ids": [8],
         "logprobs": {"content": [{"token": "token_id:8", "logprob": -1.0}]}}]},
    {**HEAD, "object": "chat.completion.chunk", "choices": [], "usage": USAGE},
)  # fmt: skip


def test_a_completion_stream_becomes_the_whole_answer() -> None:
    request = ClientRequest("completions", {"prompt": "p", "logprobs": 1})
    answer = whole_from_stream(stream_chunks(COMPLETION), request)
    assert answer == {
        **HEAD,
        "object": "text_completion",
        "choices": [{
            "index": 0, "text": " a b", "finish_reason": "length", "stop_reason": None, "token_ids": [7, 8],
            "prompt_token_ids": [1, 2],
            # vLLM's whole answer counts each offset on by the previous token's string
            "logprobs": {"text_offset": [0, 10], "token_logprobs": [-0.5, -1.5], "tokens": ["token_id:7", "token_id:8"],
                         "top_logprobs": [{"token_id:7": -0.5}, {"token_id:8": -1.5}]},
        }],
        "usage": USAGE,
    }  # fmt: skip


def test_a_chat_stream_becomes_the_whole_answer() -> None:
    request = ClientRequest("chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    answer = whole_from_stream(stream_chunks(CHAT), request)
    assert answer["object"] == "chat.completion" and answer["prompt_token_ids"] == [1, 2]
    assert answer["usage"] == USAGE
    assert answer["choices"] == [{
        "index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop", "stop_reason": 9,
        "token_ids": [7, 8],
        "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:8", "logprob": -1.0}]},
    }]  # fmt: skip


def test_only_a_stream_with_output_or_an_error_opens_an_answer() -> None:
    chat = ClientRequest("chat/completions", {"messages": []})
    completion = ClientRequest("completions", {"prompt": "p"})
    role, *_ = CHAT.split(b"\n\n")
    usage_only = _events({**HEAD, "choices": [], "usage": USAGE})
    assert not opens_answer(role + b"\n\n" + usage_only, chat)  # what vLLM 0.31 sends after a failed KV load
    assert not opens_answer(b"data: [DONE]\n\n", completion) and not opens_answer(b"", completion)
    assert opens_answer(CHAT, chat) and opens_answer(COMPLETION, completion)
    assert opens_answer(_events({"error": {"message": "Internal server error"}}), completion)
    eos = _events({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert opens_answer(eos, chat)


@pytest.mark.parametrize(
    ("body", "streamed"),
    [
        ({"prompt": "p"}, True),
        ({"prompt": "p", "stream": True}, False),  # streamed for the client anyway
        ({"prompt": "p", "stream_options": {"include_usage": True}}, False),  # vLLM's own 400
        ({"prompt": "p", "prompt_logprobs": 1}, False),
        ({"messages": [], "tools": [{"type": "function"}]}, False),
    ],
)
def test_which_requests_are_served_from_a_stream(body: dict[str, Any], streamed: bool) -> None:
    assert streams_whole(ClientRequest("completions", body)) is streamed
