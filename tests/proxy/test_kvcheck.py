"""The canary's KV check (pure): token ids of decode's answer against prefill's own, and when to stop serving."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pd_runtime.proxy.kvcheck import (
    CANARY_MAX_TOKENS,
    Comparison,
    KvMismatch,
    Unusable,
    canary_body,
    compare,
    stops_serving,
    token_ids,
)


def _answer(ids: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": "x", "token_ids": ids}]}


def test_the_canary_request_is_greedy_fixed_length_and_asks_for_token_ids() -> None:
    body = canary_body("m", "Hello")
    assert body == {
        "model": "m", "prompt": "Hello", "max_tokens": CANARY_MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, "stream": False,
    }  # fmt: skip


def test_equal_ids_match() -> None:
    assert compare([1, 2, 3], [1, 2, 3]) == Comparison(compared=3)
    assert compare([1, 2, 3], [1, 2, 3]).match


def test_the_first_differing_position_is_reported() -> None:
    result = compare([1, 2, 3, 4], [1, 2, 9, 8])
    assert not result.match
    assert (result.position, result.expected, result.got, result.compared) == (2, 3, 9, 4)
    assert compare([5], [6]).position == 0


def test_a_decode_answer_one_token_short_compares_over_its_length() -> None:
    """--max-tokens-policy decrement: decode answers max_tokens - 1 tokens."""
    assert compare([1, 2, 3], [1, 2]).match
    assert compare([1, 2, 3], [1, 7]).position == 1


@pytest.mark.parametrize(
    "document",
    [{}, {"choices": []}, {"choices": [{"text": "x"}]}, _answer(None), _answer([]), _answer([1, "2"]), _answer([True])],
)
def test_answers_without_token_ids_are_unusable(document: Any) -> None:
    with pytest.raises(Unusable, match="token_ids"):
        token_ids(document, "the P->D")


def test_token_ids_are_read_from_the_first_choice() -> None:
    assert token_ids(_answer([4, 5]), "x") == [4, 5]


def test_a_mismatch_says_where_and_between_whom() -> None:
    mismatch = KvMismatch(
        datetime(2026, 12, 1, tzinfo=UTC), "tx-1", "10.0.0.1:20005", "10.0.0.1:40005", compare([1, 2], [1, 3])
    )
    text = mismatch.describe()
    assert "tx-1" in text and "at token 1" in text and "expected id 2, got 3" in text
    assert "prefill 10.0.0.1:20005" in text and "decode 10.0.0.1:40005" in text
    doc = mismatch.to_json()
    assert doc["at"] == "2026-12-01T00:00:00.000Z" and doc["position"] == 1 and doc["message"] == text


def test_serving_stops_only_after_a_mismatch_and_only_when_told() -> None:
    mismatch = KvMismatch(datetime(2026, 12, 1, tzinfo=UTC), "tx-1", "p", "d", compare([1], [2]))
    assert stops_serving("stopServing", mismatch)
    assert not stops_serving("stopServing", None)
    assert not stops_serving("report", mismatch)
