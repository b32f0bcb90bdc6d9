"""Migration of a request in flight on real vLLM (docs/proxy.md, "Migration"): one prefill engine, two decode
engines (as ``decode.instances`` renders them) behind our proxy; the decode engine streaming a greedy
completion is killed mid-answer (its whole process tree), the proxy continues the request on the other decode
engine from the prompt plus the tokens already streamed, and the client's token ids and logprobs equal those
of the same request undisturbed.

Its own pod: the kill leaves it broken. The simulated engines run the calibrated profile (a token every
~19 ms at time scale 2), so the kill lands mid-stream there too; vLLM's tiny model on CPU is slower still.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from live.client import TIMEOUT_S, completion_body
from live.cluster import MODEL_NAME, Engine, Pair, running_pair
from live.conftest import engines

PROMPT = "def format_usage(self):\n    "
TOKENS = 200
KILL_AFTER = 8
SIM_TIMING = ("--profile", "qwen3-235b-mi300x", "--time-scale", "2")


@pytest.fixture(params=engines())
def one_p_two_d(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    engine = request.param
    model = request.getfixturevalue("tiny_model") if engine == "vllm" else Path(MODEL_NAME)
    with running_pair("write", model, tmp_path, engine=engine, decodes=2, sim_args=SIM_TIMING) as pair:
        yield pair


def stream(pair: Pair, body: dict[str, Any], kill: Any = None) -> tuple[list[int], list[float], list[Any]]:
    """A streamed completion through the proxy: its token ids (``token_id:N`` logprob tokens), logprobs and
    events; ``kill(tokens)`` after each event."""
    ids: list[int] = []
    logprobs: list[float] = []
    events: list[Any] = []
    with requests.post(f"{pair.proxy_url}/v1/completions", json=body, timeout=TIMEOUT_S, stream=True) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            events.append(json.loads(line.removeprefix(b"data: ")))
            for choice in events[-1].get("choices") or []:
                lp = choice.get("logprobs") or {}
                ids += [int(t.removeprefix("token_id:")) for t in lp.get("tokens") or []]
                logprobs += lp.get("token_logprobs") or []
            if kill is not None:
                kill(len(ids))
    return ids, logprobs, events


def serving_decode(pair: Pair) -> Engine:
    busy = {i["http_address"] for i in pair.status()["instances"] if i["role"] == "D" and i["in_flight"]}
    (engine,) = [e for e in pair.decode_engines if e.url.removeprefix("http://") in busy]
    return engine


def test_a_decode_killed_mid_stream_is_migrated_with_the_same_tokens(one_p_two_d: Pair) -> None:
    pair = one_p_two_d
    body = completion_body(PROMPT, max_tokens=TOKENS, stream=True, stream_options={"include_usage": True})
    expected, expected_logprobs, undisturbed = stream(pair, body)
    killed: list[Engine] = []

    def kill(tokens: int) -> None:
        if tokens >= KILL_AFTER and not killed:
            killed.append(serving_decode(pair))
            killed[0].kill()

    got, logprobs, events = stream(pair, body, kill)
    assert killed and len(expected) == TOKENS
    assert got == expected  # no token twice, none missing: the undisturbed run's greedy tokens
    # The continuation's prefill computes the streamed tokens' KV as prompt positions, where the undisturbed
    # run's decode computed them one step at a time: other kernels, so logprobs agree to rounding only.
    assert logprobs == pytest.approx(expected_logprobs, abs=1e-3)
    assert len({e["id"] for e in events}) == 1 and not [e for e in events if "error" in e]
    assert events[-1]["usage"]["completion_tokens"] == TOKENS
    assert pair.proxy_sample("pd_proxy_migrations_total", outcome="ok") == 1
    assert text_of(events) == text_of(undisturbed)  # the text across the splice too


def text_of(events: list[Any]) -> str:
    return "".join(c["text"] for e in events for c in e.get("choices") or [])
