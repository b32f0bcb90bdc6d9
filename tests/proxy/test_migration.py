"""Migration of a request in flight (docs/proxy.md, "Migration"): the pure parts, then the proxy with fake
engines that continue like a model, one decode closing its socket mid-stream beside another."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_runtime.proxy import migration
from pd_runtime.proxy.errors import LegFailure, engine_failed
from pd_runtime.proxy.legs import ClientRequest
from tests.proxy.conftest import PdSetup, SetupFactory, second_instance
from tests.proxy.proxy_fakes import FakeEngine, Recorded

PROMPT = [101, 102, 103, 104]
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 12, "stream": True}
BROKEN = LegFailure("decode", "broken", engine_failed("decode", "decode engine failed: connection broken"))


def event(choice: dict[str, Any], **top: Any) -> bytes:
    chunk = {"id": "cmpl-abc-0-1a2b3c4d", "object": "text_completion", "created": 7, "model": "m", **top}
    return b"data: " + json.dumps({**chunk, "choices": [{"index": 0, **choice}]}, separators=(",", ":")).encode()


def request(**body: Any) -> ClientRequest:
    return ClientRequest("completions", {**BODY, **body})


def streamed(tokens: migration.StreamTokens, *chunks: bytes) -> bytes:
    return tokens.feed(b"\n\n".join(chunks) + b"\n\n")


def test_the_tokens_the_client_got_are_read_and_the_ids_it_did_not_ask_for_are_null() -> None:
    tokens = migration.StreamTokens(request())
    out = streamed(
        tokens,
        event({"text": " a", "finish_reason": None, "prompt_token_ids": PROMPT, "token_ids": [7]}),
        event({"text": " b", "finish_reason": None, "prompt_token_ids": None, "token_ids": [8, 9]}),
    )
    assert tokens.prompt_ids == PROMPT and tokens.token_ids == [7, 8, 9] and not tokens.finished
    chunks = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [c["choices"][0]["token_ids"] for c in chunks] == [None, None]  # as vLLM without return_token_ids
    assert chunks[0]["choices"][0]["prompt_token_ids"] is None
    assert tokens.head == {"id": "cmpl-abc-0-1a2b3c4d", "created": 7}
    streamed(tokens, event({"text": "", "finish_reason": "length", "token_ids": [10]}))
    assert tokens.finished and tokens.token_ids == [7, 8, 9, 10]
    asked = migration.StreamTokens(request(return_token_ids=True))
    kept = streamed(asked, event({"text": " a", "prompt_token_ids": PROMPT, "token_ids": [7]}))
    assert json.loads(kept[6:])["choices"][0]["token_ids"] == [7] and asked.token_ids == [7]


@pytest.mark.parametrize(
    ("body", "endpoint", "trackable"),
    [
        ({}, "completions", True),
        ({"stream": False}, "completions", False),  # a failed leg is served again whole (failover)
        ({"stop": ["\n"]}, "completions", False),
        ({"echo": True}, "completions", False),
        ({"prompt_logprobs": 1}, "completions", False),
        ({"logprobs": 2, "stop_token_ids": [3]}, "completions", True),
        ({}, "chat/completions", False),
    ],
)
def test_which_requests_can_migrate(body: dict[str, Any], endpoint: str, trackable: bool) -> None:
    assert migration.trackable(ClientRequest(endpoint, {**BODY, **body}), limit=1) is trackable  # type: ignore[arg-type]
    assert not migration.trackable(ClientRequest("completions", BODY), limit=0)


def test_a_broken_decode_stream_migrates_within_the_limit_and_the_budget() -> None:
    tokens = migration.StreamTokens(request())
    streamed(tokens, event({"text": " a", "prompt_token_ids": PROMPT, "token_ids": [7, 8]}))
    assert migration.decide(BROKEN, request(), tokens, True, 0, 1) == "migrate"
    assert migration.decide(BROKEN, request(), tokens, True, 1, 1) == "limit_reached"
    assert migration.decide(BROKEN, request(), tokens, False, 0, 1) is None  # before the first byte: failover
    refused = LegFailure("decode", "http", engine_failed("decode", "x"))
    refused.error.status = 400
    assert migration.decide(refused, request(), tokens, True, 0, 1) is None  # the request's fault
    assert migration.decide(BROKEN, request(max_tokens=2), tokens, True, 0, 1) == "unsupported"  # nothing left
    assert migration.decide(BROKEN, request(), None, True, 0, 1) == "unsupported"  # not tracked (chat)
    assert migration.decide(BROKEN, request(), migration.StreamTokens(request()), True, 0, 1) == "unsupported"


def test_the_continuation_asks_for_the_rest_from_the_prompt_and_the_streamed_tokens() -> None:
    tokens = migration.StreamTokens(request())
    streamed(tokens, event({"text": " a", "prompt_token_ids": PROMPT, "token_ids": [7, 8]}))
    resumed = migration.continuation(request(min_tokens=5), tokens)
    assert resumed.body["prompt"] == [*PROMPT, 7, 8] and resumed.body["return_token_ids"] is True
    assert resumed.body["max_tokens"] == 10 and resumed.body["min_tokens"] == 3
    assert migration.continuation(request(max_tokens=None), tokens).body["max_tokens"] is None  # the engine's limit
    without = {k: v for k, v in BODY.items() if k != "max_tokens"}
    assert migration.continuation(ClientRequest("completions", without), tokens).body["max_tokens"] == 14  # 16 - 2


def test_the_splice_makes_the_continuation_one_response_with_the_original() -> None:
    tokens = migration.StreamTokens(request(logprobs=0))
    streamed(tokens, event({"text": " ab", "prompt_token_ids": PROMPT, "token_ids": [7, 8]}))
    splice = migration.Splice(tokens, False)
    usage = {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}
    out = splice.feed(
        event({"text": " c", "prompt_token_ids": [*PROMPT, 7, 8], "token_ids": [9], "logprobs": {"text_offset": [0]}})
        .replace(b"cmpl-abc-0-1a2b3c4d", b"cmpl-other-0-99999999")
        .replace(b'"created":7', b'"created":9')
        + b"\n\n"
        + b'data: {"id":"cmpl-other","created":9,"choices":[],"usage":'
        + json.dumps(usage).encode()
        + b"}\n\ndata: [DONE]\n\n"
    )
    first, last, done, _ = out.split(b"\n\n")
    chunk, final = json.loads(first[6:]), json.loads(last[6:])
    assert chunk["id"] == final["id"] == "cmpl-abc-0-1a2b3c4d" and chunk["created"] == final["created"] == 7
    assert chunk["choices"][0]["prompt_token_ids"] is None and chunk["choices"][0]["token_ids"] is None
    assert chunk["choices"][0]["logprobs"]["text_offset"] == [3]  # after the 3 characters streamed
    assert final["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert done == b"data: [DONE]" and tokens.token_ids == [7, 8, 9]


def texts(out: bytes) -> list[str]:
    return [json.loads(e[6:])["choices"][0]["text"] for e in out.split(b"\n\n") if e.startswith(b"data: {")]


@pytest.mark.parametrize("prompt", ["def f():", ["def f():"]])
def test_a_continuation_that_repeats_the_prompt_and_the_streamed_text_first_is_cut_to_the_new(prompt: Any) -> None:
    """vLLM's detokenizer primed with ids ending inside a character answers all the text first
    (conformance/test_migration_text.py has vLLM's own); only that first text is cut, and only when it
    repeats exactly."""
    tokens = migration.StreamTokens(request(prompt=prompt))
    streamed(
        tokens,
        event({"text": " x", "prompt_token_ids": PROMPT, "token_ids": [7]}),
        event({"text": "", "token_ids": [8]}),  # the first byte of a character
    )
    out = migration.Splice(tokens, False).feed(
        event({"text": "", "prompt_token_ids": [*PROMPT, 7, 8], "token_ids": [9]})
        + b"\n\n"
        + event({"text": "def f(): x\u00e9!", "token_ids": [10]})
        + b"\n\n"
        + event({"text": "def f(): x", "token_ids": [11]})
        + b"\n\n"
    )
    assert texts(out) == ["", "\u00e9!", "def f(): x"]
    assert tokens.text == [" x", "\u00e9!", "def f(): x"] and tokens.token_ids == [7, 8, 9, 10, 11]
    different = migration.StreamTokens(request(prompt=prompt))
    streamed(different, event({"text": " x", "prompt_token_ids": PROMPT, "token_ids": [7]}))
    assert texts(migration.Splice(different, False).feed(event({"text": "def f():", "token_ids": [8]}))) == ["def f():"]


@pytest.mark.parametrize(("by_tokens", "offsets"), [(False, [[2], [4]]), (True, [[3], [4]])])
def test_text_offsets_go_on_by_the_rule_of_the_engines_release(by_tokens: bool, offsets: list[list[int]]) -> None:
    """vLLM 0.31 begins a chunk's offsets at the text sent (the repeat of the prompt counted in, after it);
    0.32 on at the last offset plus its token's length (a byte token "\ufffd" counted while its text is held)."""
    tokens = migration.StreamTokens(request(prompt="def f():", logprobs=0))
    streamed(
        tokens,
        event({"text": " x", "prompt_token_ids": PROMPT, "token_ids": [7], "logprobs": lp([" x"], [0])}),
        event({"text": "", "token_ids": [8], "logprobs": lp(["\ufffd"], [2])}),
    )
    assert (tokens.text_chars, tokens.next_offset) == (2, 3)
    repeat = "def f(): x\u00e9!"  # the prompt, the streamed " x", then the held character and "!"
    out = migration.Splice(tokens, by_tokens).feed(
        event({"text": repeat, "token_ids": [9], "logprobs": lp(["!"], [0])})
        + b"\n\n"
        + event({"text": " y", "token_ids": [10], "logprobs": lp([" y"], [1 if by_tokens else len(repeat)])})
    )
    chunks = [json.loads(e[6:])["choices"][0] for e in out.split(b"\n\n")]
    assert [c["text"] for c in chunks] == ["\u00e9!", " y"]
    assert [c["logprobs"]["text_offset"] for c in chunks] == offsets


def lp(strings: list[str], offsets: list[int]) -> dict[str, Any]:
    return {"tokens": strings, "token_logprobs": [-0.1] * len(strings), "text_offset": offsets}


def test_a_token_id_prompt_leaves_the_continuation_text_as_it_comes() -> None:
    tokens = migration.StreamTokens(request())  # the proxy has no tokenizer to know the ids' text
    streamed(tokens, event({"text": " x", "prompt_token_ids": PROMPT, "token_ids": [7]}))
    assert texts(migration.Splice(tokens, False).feed(event({"text": " x y", "token_ids": [8]}))) == [" x y"]


# ---------------------------------------------------------------------------------------------
# The proxy, with fake engines that continue like a model
# ---------------------------------------------------------------------------------------------


def stream_tokens(text: str) -> tuple[list[str], list[Any]]:
    """The texts of a completion stream's chunks, and every JSON event."""
    events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n") if e and e != "data: [DONE]"]
    texts = [c["text"] for e in events for c in e.get("choices") or []]
    return texts, events


async def undisturbed(setup: PdSetup, body: dict[str, Any]) -> list[str]:
    die_after, setup.decode.die_after = setup.decode.die_after, None
    status, text = await setup.stream(body)
    setup.decode.die_after = die_after
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    return stream_tokens(text)[0]


async def model_pd(pd_setup: SetupFactory, mode: str, **config: Any) -> PdSetup:
    setup = await pd_setup(mode=mode, **config)
    setup.prefill.model = setup.decode.model = True
    return setup


def continuations(*engines: FakeEngine) -> list[Recorded]:
    return [r for e in engines for r in e.requests if len(r.body["prompt"]) > len(PROMPT)]


@pytest.mark.parametrize("mode", ["READ", "WRITE"])
async def test_a_decode_that_dies_mid_stream_is_continued_on_the_other_one(pd_setup: SetupFactory, mode: str) -> None:
    setup = await model_pd(pd_setup, mode)
    body = {**BODY, "stream_options": {"include_usage": True}}
    expected = await undisturbed(setup, body)
    setup.decode.die_after = 7  # whichever decode gets the request dies after 7 tokens; the other serves the 5 left
    other = await second_instance(setup, "D", mode=mode, model=True, die_after=7)
    status, text = await setup.stream(body)
    assert status == 200 and text.endswith("data: [DONE]\n\n") and '"error"' not in text
    texts, events = stream_tokens(text)
    assert texts == expected  # no duplicate, no gap
    assert len({e["id"] for e in events}) == 1
    assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert all(c.get("token_ids") is None for e in events for c in e["choices"])  # not asked for
    (resumed,) = continuations(setup.decode, other)
    assert resumed.body["prompt"][:4] == PROMPT and len(resumed.body["prompt"]) == 11
    assert resumed.body["max_tokens"] == 5
    assert setup.proxy.metrics.migrations.labels("ok")._value.get() == 1


async def test_the_limit_is_respected(pd_setup: SetupFactory) -> None:
    setup = await model_pd(pd_setup, "READ")
    setup.decode.die_after = 3
    other = await second_instance(setup, "D", model=True, die_after=3)
    status, text = await setup.stream(BODY)
    texts, events = stream_tokens(text)
    assert status == 200 and len(texts) == 6  # 3 from the first decode, 3 from the continuation
    assert events[-1]["error"]["code"] == "decode_failed" and text.endswith("data: [DONE]\n\n")
    assert len(continuations(setup.decode, other)) == 1
    metrics = setup.proxy.metrics.migrations
    assert metrics.labels("failed")._value.get() == 1 and metrics.labels("limit_reached")._value.get() == 1


async def test_two_migrations_with_a_limit_of_two(pd_setup: SetupFactory) -> None:
    setup = await model_pd(pd_setup, "READ", migration_limit=2)
    expected = await undisturbed(setup, BODY)
    setup.decode.die_after = 4  # 4 tokens on each of three decode engines
    others = [await second_instance(setup, "D", model=True, die_after=4) for _ in range(2)]
    status, text = await setup.stream(BODY)
    assert status == 200 and stream_tokens(text)[0] == expected, text
    assert len(continuations(setup.decode, *others)) == 2
    assert setup.proxy.metrics.migrations.labels("failed")._value.get() == 1  # the first continuation broke too
    assert setup.proxy.metrics.migrations.labels("ok")._value.get() == 1


async def test_no_migration_without_another_decode_gives_the_in_band_error(pd_setup: SetupFactory) -> None:
    setup = await model_pd(pd_setup, "WRITE")
    setup.decode.die_after = 4
    status, text = await setup.stream(BODY)
    texts, events = stream_tokens(text)
    assert status == 200 and len(texts) == 4 and text.endswith("data: [DONE]\n\n")
    assert events[-1]["error"]["code"] == "decode_failed"
    assert setup.proxy.metrics.migrations.labels("no_instance")._value.get() == 1


async def test_a_stream_is_read_for_its_tokens_only_where_another_decode_could_continue_it(
    pd_setup: SetupFactory,
) -> None:
    setup = await model_pd(pd_setup, "WRITE")
    status, _ = await setup.stream(BODY)
    assert status == 200 and "return_token_ids" not in setup.decode.requests[-1].body  # 1P1D: nowhere to go
    other = await second_instance(setup, "D", "WRITE", model=True)
    status, _ = await setup.stream(BODY)
    (leg,) = [r for e in (setup.decode, other) for r in e.requests if r is not setup.decode.requests[0]]
    assert status == 200 and leg.body["return_token_ids"] is True
