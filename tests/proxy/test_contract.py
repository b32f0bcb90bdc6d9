"""Contract tests: each leg's headers and body against docs/protocol.md#request-flow, literally.

Expected values are written from docs/protocol.md (regexes, keys, types), never computed with
pd_runtime.protocol, so a mistake shared by the proxy and protocol.py still fails here.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.proxy.conftest import PdSetup, SetupFactory
from tests.proxy.proxy_fakes import wait_for

UID = r"[0-9a-f]{32}"
TRANSFER_ID = re.compile(r"^tx-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
P_ZMQ = "host:127.0.0.1,handshake:6301,notify:6105"
D_ZMQ = "host:127.0.0.1,handshake:7301,notify:7501"
REQUEST_ID = re.compile(rf"^___prefill_addr_{re.escape(P_ZMQ)}___decode_addr_{re.escape(D_ZMQ)}_({UID})$")
# docs/protocol.md#request-ids: the engines' own parsing regexes.
ENGINE_PREFILL_RE = re.compile(r"___prefill_addr_(.+?)___decode_addr_")
ENGINE_DECODE_RE = re.compile(r"___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$")

CLIENT_BODY: dict[str, Any] = {
    "model": "m",
    "prompt": "Hello there",
    "max_tokens": 16,
    "min_tokens": 4,
    "temperature": 0.0,
    "stream_options": {"include_usage": True},
    "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "evil"},
    "request_id": "client-chosen",
}


def _prefill_params_expected(setup: PdSetup) -> dict[str, Any]:
    """docs/protocol.md#prefill-leg-params (G2 keys, plus the explicit remote_* keys of G1b) for a D with dp 1, tp 4."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": "127.0.0.1",
        "remote_port": str(setup.decode.port),
        "remote_handshake_port": 7301,
        "remote_notify_port": 7501,
        "remote_dp_size": 1,
        "remote_tp_size": 4,
        "tp_size": 4,
    }


def _decode_params_expected(setup: PdSetup, read: bool) -> dict[str, Any]:
    """docs/protocol.md#decode-leg-params for a P with dp 1, tp 4.

    Read mode copies engine id and block ids from P's answer (docs/protocol.md#prefill-answer).
    """
    return {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": "127.0.0.1:6301" if read else None,
        "remote_block_ids": [1, 2, 3] if read else None,
        "remote_host": "127.0.0.1",
        "remote_port": str(setup.prefill.port),
        "remote_handshake_port": 6301,
        "remote_notify_port": 6105,
        "remote_dp_size": 1,
        "remote_tp_size": 4,
        "tp_size": 4,
    }


def _check_types(params: dict[str, Any]) -> None:
    for key in ("remote_dp_size", "remote_tp_size", "tp_size", "remote_handshake_port", "remote_notify_port"):
        assert type(params[key]) is int, key
    assert isinstance(params["remote_port"], str)
    assert TRANSFER_ID.match(params["transfer_id"])


async def _gate_prefill_on_decode(setup: PdSetup) -> asyncio.Task[None]:
    """Write mode: P answers only once D has its request, proving the legs overlap."""
    gate = asyncio.Event()
    setup.prefill.prefill_gate = gate

    async def open_gate() -> None:
        await wait_for(lambda: "D:recv" in setup.events, what="decode leg")
        gate.set()

    return asyncio.create_task(open_gate())


@pytest.mark.parametrize("generation", ["G1", "G2"])
@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_legs_follow_section_3(pd_setup: SetupFactory, generation: str, mode: str) -> None:
    setup = await pd_setup(mode=mode, generation=generation, engine_api_key="engine-secret")
    opener = await _gate_prefill_on_decode(setup) if mode == "WRITE" else None

    status, text = await setup.stream(CLIENT_BODY)
    assert status == 200
    if opener is not None:
        await opener
        await wait_for(lambda: "P:done" in setup.events, what="prefill answer")

    (p_req,) = setup.prefill.requests
    (d_req,) = setup.decode.requests
    # docs/protocol.md#request-ids: one X-Request-Id on both legs, peers embedded, 32 lowercase hex at the end.
    request_id = p_req.headers["X-Request-Id"]
    assert d_req.headers["X-Request-Id"] == request_id
    match = REQUEST_ID.match(request_id)
    assert match, request_id
    assert ENGINE_PREFILL_RE.search(request_id).group(1) == P_ZMQ  # type: ignore[union-attr]
    assert ENGINE_DECODE_RE.search(request_id).group(1) == D_ZMQ  # type: ignore[union-attr]
    for req in (p_req, d_req):
        assert req.path == "/v1/completions"
        assert req.headers["Authorization"] == "Bearer engine-secret"
        assert "X-data-parallel-rank" not in req.headers
        assert "request_id" not in req.body

    # docs/protocol.md#http-legs, docs/protocol.md#prefill-leg-params: the prefill leg.
    assert p_req.body["stream"] is False
    assert p_req.body["max_tokens"] == 1
    assert "stream_options" not in p_req.body
    assert p_req.body["min_tokens"] == 1  # its one token never stops: prefill always returns KV
    assert p_req.body["prompt"] == "Hello there"
    p_params = p_req.body["kv_transfer_params"]
    _check_types(p_params)
    assert {k: v for k, v in p_params.items() if k != "transfer_id"} == _prefill_params_expected(setup)

    # docs/protocol.md#decode-leg-params: the client's stream flag, limits and options kept; the same transfer id.
    assert d_req.body["stream"] is True
    assert d_req.body["max_tokens"] == 16
    assert d_req.body["min_tokens"] == 4
    assert d_req.body["stream_options"] == {"include_usage": True}
    d_params = d_req.body["kv_transfer_params"]
    _check_types(d_params)
    assert d_params["transfer_id"] == p_params["transfer_id"]
    assert {k: v for k, v in d_params.items() if k != "transfer_id"} == _decode_params_expected(setup, mode == "READ")

    # Ordering: read is strictly serial; write sends D before P has finished.
    if mode == "READ":
        assert setup.events[:3] == ["P:recv", "P:done", "D:recv"]
        assert d_req.received >= p_req.answered  # type: ignore[operator]
    else:
        assert setup.events.index("D:recv") < setup.events.index("P:done")

    # docs/protocol.md#toy-proxy: the client sees the uid, never engine addresses.
    assert "___prefill_addr" not in text and "127.0.0.1" not in text
    assert f"cmpl-{match.group(1)}-0-0a1b2c3d" in text
    assert text.endswith("data: [DONE]\n\n")


async def test_chat_completions_go_to_the_chat_route_with_both_limits_clamped(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}
    status, _ = await setup.post("/v1/chat/completions", body)
    assert status == 200
    (p_req,) = setup.prefill.requests
    (d_req,) = setup.decode.requests
    assert p_req.path == d_req.path == "/v1/chat/completions"
    assert p_req.body["max_tokens"] == 1 and p_req.body["max_completion_tokens"] == 1
    assert d_req.body["max_completion_tokens"] == 8 and "max_tokens" not in d_req.body


async def test_data_parallel_ranks_pin_both_legs(pd_setup: SetupFactory) -> None:
    """X-data-parallel-rank on P when P.dp > 1, remote_dp_rank on D; D on the same rank when sizes match.

    docs/protocol.md#prefill-leg-params, docs/protocol.md#decode-leg-params.
    """
    setup = await pd_setup(register=False, mode="WRITE")
    setup.prefill.dp_size = 2
    setup.decode.dp_size = 2
    await setup.registrar.send(setup.prefill.g2_registration())
    await setup.registrar.send(setup.decode.g2_registration())
    await wait_for(lambda: not setup.proxy.not_ready_reason(), what="registration")
    for _ in range(2):
        status, _ = await setup.post("/v1/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4})
        assert status == 200
    p_ranks = [r.headers["X-data-parallel-rank"] for r in setup.prefill.requests]
    d_ranks = [r.headers["X-data-parallel-rank"] for r in setup.decode.requests]
    assert sorted(p_ranks) == ["0", "1"]
    assert d_ranks == p_ranks
    for p_req, d_req in zip(setup.prefill.requests, setup.decode.requests, strict=True):
        assert d_req.body["kv_transfer_params"]["remote_dp_rank"] == int(p_req.headers["X-data-parallel-rank"])
        assert p_req.body["kv_transfer_params"]["remote_dp_size"] == 2
        assert d_req.body["kv_transfer_params"]["remote_dp_size"] == 2


async def test_client_request_id_header_is_not_forwarded(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    status, _ = await setup.post(
        "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3}, headers={"X-Request-Id": "mine"}
    )
    assert status == 200
    for req in (*setup.prefill.requests, *setup.decode.requests):
        assert REQUEST_ID.match(req.headers["X-Request-Id"])
        assert "Authorization" not in req.headers  # no engine key configured: nothing sent


async def test_decrement_policy_matches_the_toy_proxy_but_never_reaches_zero(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", max_tokens_policy="decrement")
    for max_tokens in (16, 1):
        await setup.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": max_tokens})
    assert [r.body["max_tokens"] for r in setup.decode.requests] == [15, 1]
    assert [r.body["max_tokens"] for r in setup.prefill.requests] == [1, 1]


async def test_missing_max_tokens_is_forwarded_absent(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    status, _ = await setup.post("/v1/completions", {"model": "m", "prompt": "x"})
    assert status == 200
    assert "max_tokens" not in setup.decode.requests[0].body
    assert setup.prefill.requests[0].body["max_tokens"] == 1
