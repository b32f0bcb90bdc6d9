"""Clients that go away, and KV transfers that fail: a clear answer in bounded time, nothing left behind.

After each case both engines' own gauges return to nothing running, waiting or held (``wait_idle``), so an
abandoned leg that vLLM keeps (a decode request waiting for KV forever, blocks never freed) fails the test.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from urllib.parse import urlsplit

import pytest
import requests

from live.client import TIMEOUT_S, completion_body, generate, post, reap_expired_send
from live.cluster import ENGINE_RELEASE, Faults, Pair, wait_idle, wait_idle_accepting_decode_leak, wait_until
from pd_runtime.vllm_releases import release

PROMPT = "def dedent(text):\n    "

log = logging.getLogger(__name__)


def _connection(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=TIMEOUT_S)


def _send(url: str, body: dict[str, object]) -> http.client.HTTPConnection:
    conn = _connection(url)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn


def test_disconnect_during_prefill(pair: Pair) -> None:
    conn = _send(pair.proxy_url, completion_body("word " * 400, max_tokens=64))
    conn.close()
    wait_idle(pair)


def test_disconnect_during_kv_wait(pair: Pair, faults: Faults) -> None:
    """Both legs are aborted. In write mode vLLM's decode (0.31, 0.32) then keeps the request's KV blocks for good
    (nothing running or waiting, ``vllm:kv_cache_usage_perc`` above 0 long after the late write landed):
    a vLLM bug, asserted here so that a release without it fails this test; the pair's later tests accept
    what it leaked (``pair.leaked``)."""
    faults.set("delay", seconds=8)
    conn = _send(pair.proxy_url, completion_body(PROMPT + "kv wait", max_tokens=64))
    time.sleep(3)
    conn.close()
    if pair.mode == "read":
        wait_idle(pair)
        return
    before = pair.leaked["decode"]
    time.sleep(15)  # past the 8 s delay: the late write has landed
    leaked = wait_idle_accepting_decode_leak(pair)
    assert leaked > before, "vLLM no longer leaks decode KV after an abort during the KV wait: drop the allowance"


def test_disconnect_mid_stream(pair: Pair) -> None:
    conn = _send(pair.proxy_url, completion_body(PROMPT + "mid stream", max_tokens=400, stream=True))
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read1(1024)
    conn.close()
    wait_idle(pair)


def test_delayed_transfer_still_gives_the_whole_answer(pair: Pair, faults: Faults) -> None:
    body = completion_body(PROMPT + "delayed")
    whole = generate(pair.prefill.url, "/v1/completions", body)
    faults.set("delay", seconds=3)
    through = generate(pair.proxy_url, "/v1/completions", body)
    assert (through.token_ids, through.logprobs) == (whole.token_ids, whole.logprobs)
    wait_idle(pair)


@pytest.mark.parametrize("fault", ["fail", "drop"])
def test_lost_transfer_gets_a_clear_answer(pair: Pair, faults: Faults, fault: str) -> None:
    """A failed or never-completing transfer, streamed: the right answer (vLLM recomputed the prompt) or the
    failure contract's KV transfer error (502 ``kv_transfer_error``, docs/proxy.md), within the proxy's KV wait
    (``--kv-wait-timeout``); never a hang, never a wrong answer. In write mode vLLM 0.31's prefill logs
    the failed write and answers 200, and decode waits for the KV for good: only the proxy's KV wait ends
    it."""
    if (pair.engine, pair.mode) == ("vllm", "write"):
        pytest.skip(
            "write mode, failed or timed-out write: vLLM 0.31 may kill prefill's EngineCore (TransferError "
            "raised from wait_for_save -> seal_pending_transfers on the engine thread), which would take the "
            "shared pair down; needs a pair of its own (docs/vllm-versions.md)"
        )
    if (pair.engine, pair.mode, fault) == ("vllm", "read", "drop"):
        pytest.skip(
            "read mode, dropped read: vLLM 0.31's decode keeps the never-completing read pending and later "
            "reads on the shared pair time out (30 s each) or fail with a 500, even past recv_abort_timeout; "
            "needs a pair of its own, or a stand-in whose dropped read fails its status like real MoRI "
            "(docs/live-tier.md)"
        )
    body = completion_body(PROMPT + fault, stream=True)
    whole = generate(pair.prefill.url, "/v1/completions", body | {"stream": False})
    faults.set(fault)
    with requests.post(f"{pair.proxy_url}/v1/completions", json=body, timeout=TIMEOUT_S, stream=True) as resp:
        faults.clear()
        if (pair.mode, fault) == ("read", "fail") and not release(ENGINE_RELEASE).streams_error_before_first_token:
            # vLLM 0.31 fails the decode request (kv_load_failure_policy=fail) and streams neither a token nor
            # its error (relay.opens_answer): the proxy answers 502 instead of an empty HTTP 200; from 0.32
            # the stream carries vLLM's own error event, which the proxy passes on (checked below)
            assert resp.status_code == 502, resp.text
            assert resp.json()["error"]["code"] == "kv_load_failed", resp.text
        if resp.status_code != 200:
            assert resp.status_code == 502 and resp.json()["error"]["type"] == "kv_transfer_error", resp.text
        else:
            events = [line for line in resp.iter_lines() if line.startswith(b"data: ")]
            chunks = [json.loads(e.removeprefix(b"data: ")) for e in events if e != b"data: [DONE]"]
            errors = [c["error"] for c in chunks if "error" in c]
            choices = [ch for c in chunks for ch in c.get("choices", [])]
            logprobs = [lp for ch in choices for lp in (ch.get("logprobs") or {}).get("token_logprobs") or []]
            assert errors or logprobs == whole.logprobs, chunks
    if pair.mode == "write":
        wait_idle_accepting_decode_leak(pair)
        return
    if fault == "drop":  # decode never reads nor releases: prefill's send expires
        reap_expired_send(pair, PROMPT)
    wait_idle(pair)


def test_a_request_not_streamed_ends_at_the_kv_wait(pair: Pair, faults: Faults) -> None:
    """KV slower than the proxy's KV wait, for a client that asked for no stream: 502 kv_transfer_timeout,
    where the delayed KV would have given a 200 (the proxy streams decode's leg to see its first byte,
    legs.streams_whole; before, the KV wait counted to a first body byte that a whole answer sends only
    when done, and the client waited for the response timeout, 1800 s), and both legs are aborted.

    In write mode vLLM 0.31 often holds prefill's answer until the slow write has completed (about half the
    attempts here): when its writer thread has posted every write of the request before the engine thread
    seals them, the engine thread waits for the transfer itself (``moriio_engine.py``,
    ``seal_pending_transfers`` -> ``_finalize_if_complete`` -> ``waiting_for_transfer_complete``;
    docs/vllm-versions.md). The KV wait, counted from prefill's answer, then has nothing left to wait for,
    and the answer is a right 200. So a 200 must come with a prefill leg that took the KV's delay (the
    proxy's own leg histogram), and the case is tried again until it meets a prefill that answered first."""
    kv_wait, delay, attempts = 2, 5, 12
    for attempt in range(attempts):
        resp, prefill_s = _slow_kv_request(pair, faults, f"slow kv {attempt}", kv_wait, delay)
        if resp.status_code != 200:
            break
        assert prefill_s >= delay, f"decode answered {delay} s late, past the {kv_wait} s KV wait ({resp.text})"
        log.info("attempt %d: vLLM held prefill's answer %.1f s, until the delayed write was done", attempt, prefill_s)
        wait_idle(pair)
    else:
        pytest.fail(f"vLLM held prefill's answer until the delayed write was done in all {attempts} attempts")
    assert resp.status_code == 502, resp.text
    assert (resp.json()["error"]["type"], resp.json()["error"]["code"]) == ("kv_transfer_error", "kv_transfer_timeout")
    time.sleep(delay)  # past the delay: the late transfer has landed
    if pair.mode == "write":
        wait_idle_accepting_decode_leak(pair)
    else:
        wait_idle(pair)


def _slow_kv_request(
    pair: Pair, faults: Faults, suffix: str, kv_wait: float, delay: float
) -> tuple[requests.Response, float]:
    """One request not streamed, its KV delayed past the KV wait: the answer, and how long the proxy's
    prefill leg took (its leg histogram's sum, read once the leg is counted: a write-mode prefill leg may
    end after the client's answer)."""
    leg = {"leg": "prefill"}
    legs = pair.proxy_sample("pd_proxy_leg_seconds_count", **leg)
    seconds = pair.proxy_sample("pd_proxy_leg_seconds_sum", **leg)
    with pair.proxy_settings(**{"kv-wait-timeout": kv_wait}):
        faults.set("delay", seconds=delay)
        body = completion_body(PROMPT + suffix)
        resp = requests.post(f"{pair.proxy_url}/v1/completions", json=body, timeout=TIMEOUT_S)
        faults.clear()
    wait_until(lambda: pair.proxy_sample("pd_proxy_leg_seconds_count", **leg) > legs, time.monotonic() + 60, pair.proxy)
    return resp, pair.proxy_sample("pd_proxy_leg_seconds_sum", **leg) - seconds


def test_a_request_not_streamed_is_the_whole_answer(pair: Pair) -> None:
    """Served from decode's stream, the whole answer carries what vLLM's own does: text, token ids and
    logprobs equal to one engine computing it whole, the finish reason and the usage."""
    body = completion_body(PROMPT + "whole", return_token_ids=True)
    whole = post(pair.prefill.url, "/v1/completions", body).json()
    through = post(pair.proxy_url, "/v1/completions", body).json()
    for key in ("text", "token_ids", "prompt_token_ids", "logprobs", "finish_reason", "stop_reason"):
        assert through["choices"][0][key] == whole["choices"][0][key], key
    assert {k: through["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
