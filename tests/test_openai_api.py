"""Endpoint URLs, SSE decoding across arbitrary read boundaries, and the meaning of stream chunks."""

from __future__ import annotations

import json

import pytest

from pd_runtime.openai_api import Endpoint, SseDecoder, endpoint_url, interpret


@pytest.mark.parametrize(
    ("base", "endpoint", "expected"),
    [
        ("http://h:8000", Endpoint.COMPLETIONS, "http://h:8000/v1/completions"),
        ("http://h:8000/", Endpoint.CHAT, "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1", Endpoint.COMPLETIONS, "http://h:8000/v1/completions"),
        ("http://h/v1/completions", Endpoint.COMPLETIONS, "http://h/v1/completions"),
        ("http://h/api/v1/chat/completions/", Endpoint.CHAT, "http://h/api/v1/chat/completions"),
    ],
)
def test_endpoint_url(base: str, endpoint: Endpoint, expected: str) -> None:
    assert endpoint_url(base, endpoint) == expected


STREAM = (
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"text":"a"}]}\n\n'
    b'data: {"choices":[{"text":"b"}]}\r\n\r\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def test_decoder_is_independent_of_read_boundaries() -> None:
    whole = SseDecoder().feed(STREAM)
    for size in (1, 2, 3, 7, 64):
        decoder = SseDecoder()
        pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
        assert [p for piece in pieces for p in decoder.feed(piece)] == whole
        assert not decoder.pending
    assert len(whole) == 4 and whole[-1] == "[DONE]"


def test_decoder_keeps_an_unfinished_event() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"choices"') == []
    assert decoder.pending


def test_multiline_data_is_joined() -> None:
    assert SseDecoder().feed(b"data: a\ndata: b\nid: 1\n\n") == ["a\nb"]


def test_interpret_completion_chunks() -> None:
    assert interpret(json.loads('{"choices":[{"text":"x"}]}'), Endpoint.COMPLETIONS).carries_token
    assert interpret({"choices": [{"text": ""}]}, Endpoint.COMPLETIONS).carries_token
    usage = interpret({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, Endpoint.COMPLETIONS)
    assert not usage.carries_token and usage.completion_tokens == 2 and usage.prompt_tokens == 3


def test_interpret_chat_role_chunk_is_not_a_token() -> None:
    assert not interpret({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, Endpoint.CHAT).carries_token
    assert interpret({"choices": [{"delta": {"content": "hi"}}]}, Endpoint.CHAT).carries_token


def test_interpret_stream_error_and_garbage() -> None:
    assert interpret({"error": {"message": "boom"}}, Endpoint.COMPLETIONS).error == "stream_error: boom"
    assert interpret([1, 2], Endpoint.COMPLETIONS).error is not None
    assert interpret({"choices": "x", "usage": {"completion_tokens": True}}, Endpoint.COMPLETIONS) == interpret(
        {}, Endpoint.COMPLETIONS
    )
