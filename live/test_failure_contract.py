"""Engine deaths on real engines, against docs/proxy.md's failure contract: what the client sees in each
phase, and that the surviving engine is left with nothing running, waiting or held.

Each test kills an engine, so each starts a pair of its own (``own_pair``). The simulated engines run the
calibrated profile, whose tokens take tens of milliseconds: with the instant one a stream is over before a
kill lands. Transfer failures on real engines are ``test_faults.py``'s (their status and error type too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests

from live.client import TIMEOUT_S, completion_body, reap_expired_send
from live.cluster import Pair, wait_idle, wait_idle_accepting_decode_leak

SIM_ARGS = ["--profile", "qwen3-235b-mi300x"]
PROMPT = "def shutil_copy(src, dst):\n    "


def _events(lines: Iterator[bytes]) -> list[Any]:
    """Every SSE payload of a stream's lines, ``[DONE]`` as the string."""
    payloads = [line.removeprefix(b"data: ") for line in lines if line.startswith(b"data: ")]
    return [p.decode() if p == b"[DONE]" else json.loads(p) for p in payloads]


def _failures(pair: Pair, cause: str, phase: str) -> float:
    return pair.proxy_sample("pd_proxy_failures_total", cause=cause, phase=phase)


def _refused_by_a_dead_engine(resp: requests.Response, leg: str) -> None:
    """A dead engine's leg, before the client has a byte: 502 ``<leg>_failed`` (``upstream_error``); or,
    once the proxy's /health probes have taken it out of rotation (two failed, seconds after the kill),
    503 ``no_<leg>_instance``."""
    error = resp.json()["error"]
    if resp.status_code == 503:
        assert error["code"] == f"no_{leg}_instance", resp.text
        return
    assert resp.status_code == 502, resp.text
    assert (error["type"], error["code"]) == ("upstream_error", f"{leg}_failed"), resp.text


def test_engine_failed_a_decode_killed_mid_stream_then_before_headers(own_pair: Pair) -> None:
    """After the first byte: the tokens so far, one ``decode_failed`` error event, ``[DONE]``, never a retry.
    Then a request while the dead decode is still routed to: an HTTP error, no stream. Prefill holds
    nothing afterwards. In read mode, when that request's prefill leg ran (502: decode refused it after), prefill
    keeps its blocks for a read that never comes: vLLM reaps such a deferred send after ``defer_timeout``, on
    its scheduler's next step (``update_connector_output``), so an idle prefill holds them until a request
    comes; one plain request to prefill past the timeout must free them."""
    pair = own_pair
    body = completion_body(PROMPT, max_tokens=400, stream=True)
    with requests.post(f"{pair.proxy_url}/v1/completions", json=body, timeout=TIMEOUT_S, stream=True) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith(b"data: "))
        pair.decode.kill()
        rest = _events(lines)
    assert "choices" in json.loads(first.removeprefix(b"data: ")) and rest[-1] == "[DONE]", rest[-3:]
    errors = [event["error"] for event in rest[:-1] if "error" in event]
    assert len(errors) == 1 and "error" in rest[-2], rest[-3:]
    assert (errors[0]["type"], errors[0]["code"]) == ("upstream_error", "decode_failed"), errors
    assert _failures(pair, "engine_failed", "after_first_byte") == 1
    after = requests.post(f"{pair.proxy_url}/v1/completions", json=completion_body(PROMPT), timeout=TIMEOUT_S)
    _refused_by_a_dead_engine(after, "decode")
    if pair.mode == "read" and after.status_code == 502:
        reap_expired_send(pair, PROMPT)
    wait_idle(pair)  # the living engines: prefill


def test_engine_failed_a_prefill_killed_before_headers(own_pair: Pair) -> None:
    """Before the first byte: an HTTP error naming the prefill leg; in write mode the decode leg, sent
    first and waiting for KV, is closed, and decode runs and waits for nothing afterwards. Its blocks are
    free too, unless decode allocated them before the close: an abort during the KV wait keeps them in the
    releases with that leak (docs/vllm-versions.md), as on a longer wait."""
    pair = own_pair
    pair.prefill.kill()
    body = completion_body(PROMPT, max_tokens=16, stream=True)
    resp = requests.post(f"{pair.proxy_url}/v1/completions", json=body, timeout=TIMEOUT_S)
    _refused_by_a_dead_engine(resp, "prefill")
    if pair.mode == "write":
        wait_idle_accepting_decode_leak(pair)
    else:
        wait_idle(pair)  # the living engines: decode
