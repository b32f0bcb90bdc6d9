"""The request path's JSON reads and writes the same documents with orjson (the proxy extra) and without it."""

from __future__ import annotations

import json

import pytest

from pd_runtime.proxy import jsoncodec

DOCUMENTS = [
    {"model": "m", "prompt": 'héllo \u2028 "quoted" \\ back', "max_tokens": 7, "stream": True},
    {"prompt": list(range(2000)), "temperature": 0.25, "stop": None, "n": 1, "logit_bias": {"50256": -100}},
    {"messages": [{"role": "user", "content": "x"}], "nested": {"a": [1, 2.5, False, None, "🙂"]}},
]


@pytest.fixture(params=["orjson", "json"])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(jsoncodec, "_orjson_loads", None)
        monkeypatch.setattr(jsoncodec, "_orjson_dumps", None)
    return str(request.param)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_what_is_written_reads_back_as_the_same_document(codec: str, document: object) -> None:
    written = jsoncodec.dumps(document)
    assert b", " not in written and b": " not in written  # compact
    assert json.loads(written) == document == jsoncodec.loads(written)
    assert jsoncodec.loads(json.dumps(document)) == document


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "{", "[1,]", '{"a": 1} x', "\xff"])
def test_what_is_not_json_is_refused(codec: str, text: str) -> None:
    with pytest.raises(ValueError):
        jsoncodec.loads(text.encode("latin-1"))


def test_a_refusal_names_what_is_wrong_and_a_lone_surrogate_stays_refused(codec: str) -> None:
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        jsoncodec.loads(b'{"temperature": NaN}')
    if codec == "orjson":  # json reads it; orjson, which the proxy runs with, refuses it
        with pytest.raises(ValueError):
            jsoncodec.loads(b'{"prompt": "\\ud800"}')


def test_an_engines_nan_is_read_as_pythons_json_reads_it(codec: str) -> None:
    answer = jsoncodec.engine_loads(b'{"logprob": -Infinity, "x": NaN}')
    assert answer["logprob"] == float("-inf") and answer["x"] != answer["x"]


def test_an_integer_past_64_bits_is_still_written(codec: str) -> None:
    assert json.loads(jsoncodec.dumps({"seed": 2**70})) == {"seed": 2**70}
