"""Usage reconciliation (docs/proxy.md, "Usage"): the client sees prefill's prompt_tokens_details (its
prefix-cache hit), not decode's, in whole answers and in the streamed usage chunk, over real HTTP."""

from __future__ import annotations

import json

import pytest

from pd_runtime.proxy.relay import merge_usage, merge_usage_events, prompt_details
from tests.proxy.conftest import PdSetup, SetupFactory

BODY = {"model": "m", "prompt": "Hello there", "max_tokens": 4}
PREFILL_CACHED = 3  # the prefix-cache hit on prefill
DECODE_CACHED = 5  # decode's view: the whole prompt arrived as KV


async def _setup(pd_setup: SetupFactory, mode: str, prefill_cached: int | None = PREFILL_CACHED) -> PdSetup:
    setup = await pd_setup(mode=mode)
    setup.prefill.cached_tokens = prefill_cached
    setup.decode.cached_tokens = DECODE_CACHED
    if mode == "WRITE":
        # Decode's answer waits for the KV, which real engines have after prefill's answer; the fake
        # emulates that wait (docs/proxy.md, "Usage", for a prefill answer later than decode's usage).
        setup.decode.first_chunk_delay = 0.5
    return setup


def _usage_events(text: str) -> list[dict[str, object]]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: {")]
    return [doc["usage"] for doc in map(json.loads, events) if doc.get("usage")]


def test_merge_usage_replaces_only_the_prompt_details() -> None:
    details = {"cached_tokens": 3}
    body = b'{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":5}}}'
    assert json.loads(merge_usage(body, details))["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": details,
    }
    assert merge_usage(b'{"id":"x"}', details) == b'{"id":"x"}'
    assert merge_usage(b'{"prompt_tokens": not json', details) == b'{"prompt_tokens": not json'
    events = b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":5}}\n\ndata: [DONE]\n\n'
    merged = merge_usage_events(events, details)
    assert merged.startswith(b'data: {"choices":[{"text":"a"}]}\n\n') and merged.endswith(b"\n\ndata: [DONE]\n\n")
    assert b'"prompt_tokens_details":{"cached_tokens":3}' in merged
    assert prompt_details({"usage": {"prompt_tokens": 5}}) is None
    assert prompt_details({"usage": {"prompt_tokens_details": details}}) == details
    assert prompt_details(None) is None


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_whole_answer_reports_prefills_cached_tokens(pd_setup: SetupFactory, mode: str) -> None:
    setup = await _setup(pd_setup, mode)
    status, doc = await setup.post("/v1/completions", BODY)
    assert status == 200
    assert doc["usage"]["prompt_tokens_details"] == {"cached_tokens": PREFILL_CACHED}
    assert doc["usage"]["completion_tokens"] == setup.decode.chunks  # the rest of usage is decode's


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_streamed_usage_chunk_reports_prefills_cached_tokens(pd_setup: SetupFactory, mode: str) -> None:
    setup = await _setup(pd_setup, mode)
    status, text = await setup.stream({**BODY, "stream_options": {"include_usage": True}})
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    (usage,) = _usage_events(text)
    assert usage["prompt_tokens_details"] == {"cached_tokens": PREFILL_CACHED}
    assert usage["completion_tokens"] == setup.decode.chunks


async def test_without_prefill_details_decodes_usage_passes_unchanged(pd_setup: SetupFactory) -> None:
    setup = await _setup(pd_setup, "READ", prefill_cached=None)
    status, doc = await setup.post("/v1/completions", BODY)
    assert status == 200
    assert doc["usage"]["prompt_tokens_details"] == {"cached_tokens": DECODE_CACHED}
    status, text = await setup.stream({**BODY, "stream_options": {"include_usage": True}})
    assert status == 200
    assert [u["prompt_tokens_details"] for u in _usage_events(text)] == [{"cached_tokens": DECODE_CACHED}]
