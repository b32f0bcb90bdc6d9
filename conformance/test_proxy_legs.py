"""The real `pdctl proxy` (real HTTP, real ZMQ), fed by registrations vLLM's connector sends, judged leg by
leg by vLLM's connector: every flow, every leg (conformance/engines.py says how a leg is judged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common

from conformance.deployment import Deployment, deployment
from conformance.engines import ABANDON_GRACE_S, Behaviour, LegRecord

PROMPT = "The quick brown fox jumps over the lazy dog"


async def complete(dep: Deployment, stream: bool, max_tokens: int = 8) -> tuple[int, str]:
    body = {"model": "Qwen/Qwen3-235B-A22B-FP8", "prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}
    async with (
        aiohttp.ClientSession() as session,
        session.post(dep.proxy_url + "/v1/completions", json=body) as resp,
    ):
        return resp.status, await resp.text()


def violations(dep: Deployment) -> list[str]:
    found = [
        f"{leg.engine} leg {leg.request_id or '?'}: {v}"
        for e in dep.engines.values()
        for leg in e.legs
        for v in leg.violations
    ]
    for leg in dep.legs("decode"):
        if not (leg.answered or leg.closed_by_proxy):
            found.append(f"decode leg {leg.request_id} neither answered nor closed by the proxy")
    return found


async def assert_conformant(dep: Deployment) -> None:
    await dep.settle(ABANDON_GRACE_S + 3)
    problems = violations(dep)
    assert not problems, "\n".join(problems)


def clients(legs: list[LegRecord]) -> list[LegRecord]:
    """The legs of the tests' own requests: the proxy's canary (its own prompt) runs at start and again
    whenever the routable engines change, so its legs may come at any time."""
    return [leg for leg in legs if leg.body.get("prompt") == PROMPT]


def pairs(dep: Deployment) -> list[tuple[LegRecord, LegRecord]]:
    prefills = {leg.transfer_id: leg for leg in clients(dep.legs("prefill"))}
    return [(prefills[leg.transfer_id], leg) for leg in clients(dep.legs("decode")) if leg.transfer_id in prefills]


@pytest.mark.parametrize("mode", ["write", "read"])
async def test_registrations_come_from_vllms_connector(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with deployment(mode, Behaviour(), monkeypatch, tmp_path) as dep:
        async with aiohttp.ClientSession() as session, session.get(dep.admin_url + "/status") as resp:
            status = json.dumps(await resp.json())
        kinds = {p["type"]: p for p in dep.registrations}
        assert set(kinds) == {"P", "D"}
        assert all(p["transfer_mode"] == mode.upper() for p in kinds.values())
        for payload in kinds.values():
            assert payload["http_address"] in status  # the proxy took what vLLM announced


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["write", "read"])
async def test_every_leg_of_a_transfer_is_what_vllm_expects(
    mode: str, stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with deployment(mode, Behaviour(prefill_delay_s=0.2), monkeypatch, tmp_path) as dep:
        results = await asyncio.gather(*(complete(dep, stream) for _ in range(3)))
        assert [status for status, _ in results] == [200] * 3, results
        assert all("tok" in text for _, text in results)
        await assert_conformant(dep)
        legs = pairs(dep)
        assert len(legs) == 3 == len(clients(dep.legs("prefill"))) == len(clients(dep.legs("decode")))
        for prefill, decode in legs:
            assert prefill.headers["X-Request-Id"] == decode.headers["X-Request-Id"]
            assert decode.matched is not None and decode.matched[0] > 0  # the connector takes the KV ...
            assert decode.matched[1] == (mode == "write")  # ... asynchronously in write mode
        if mode == "write":  # vLLM's decode scheduler told the prefill (found through the request id) its blocks
            told = {n["transfer_id"] for n in dep.engines["prefill"].notifies if n.get("type") == "remote_blocks"}
            assert told >= {d.transfer_id for _, d in legs}


async def test_colocated_legs_are_plain_requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with deployment("colocated", Behaviour(), monkeypatch, tmp_path) as dep:
        results = [await complete(dep, stream) for stream in (False, True, False)]
        assert [status for status, _ in results] == [200] * 3
        legs = dep.legs("engine")
        assert len(legs) == 3 and {e.http_port for e in dep.engines.values() if e.legs} == {
            e.http_port for e in dep.engines.values()
        }
        for leg in legs:
            assert leg.kv_transfer_params is None and not leg.violations
            for producer in (True, False):  # no peer claimed: the engines would not look for one
                assert moriio_common.get_peer_zmq_from_request_id(leg.request_id, is_producer=producer) is None


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["write", "read"])
async def test_a_first_token_that_would_end_the_request_is_sampled_by_decode(
    mode: str, stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The prompt's first token is EOS: without min_tokens vLLM's prefill would stop there and return
    kv_transfer_params null; the prefill leg's min_tokens 1 (as vLLM's API server parses it) keeps it
    length-capped, so the KV goes to decode, which answers."""
    async with deployment(mode, Behaviour(first_token_ends=True), monkeypatch, tmp_path) as dep:
        status, text = await complete(dep, stream)
        prefill = dep.legs("prefill")
        assert prefill and all(leg.body.get("min_tokens") == 1 for leg in prefill)
        await assert_conformant(dep)
        assert status == 200 and "tok" in text and "first" not in text, (status, text)  # decode's answer


@pytest.mark.parametrize("mode", ["write", "read"])
async def test_a_client_that_goes_away_closes_every_leg(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with deployment(mode, Behaviour(prefill_delay_s=5.0), monkeypatch, tmp_path) as dep:
        # The proxy's canary runs once the engines are routable: let its legs end, so that only the
        # client's legs are judged below.
        await _until(lambda: bool(dep.legs("prefill")) and all(leg.answered for leg in dep.legs("prefill")), 30.0)
        canary = len(dep.legs("prefill")), len(dep.legs("decode"))
        request = asyncio.create_task(complete(dep, stream=True))
        await _until(lambda: bool(clients(dep.legs("prefill")[canary[0] :])), 5.0)  # the request's own leg
        await asyncio.sleep(0.3)
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        prefill, decode = clients(dep.legs("prefill")[canary[0] :]), clients(dep.legs("decode")[canary[1] :])
        await _until(lambda: all(leg.closed_by_proxy or leg.answered for leg in prefill + decode), 10.0)
        assert prefill and all(leg.closed_by_proxy for leg in prefill), "prefill leg left running after cancel"
        assert all(leg.closed_by_proxy or leg.answered for leg in decode)
        assert len(decode) == (1 if mode == "write" else 0)
        await assert_conformant(dep)


async def _until(condition: Any, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.05)
