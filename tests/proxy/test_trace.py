"""W3C trace context (docs/proxy.md, "Trace context"): a client's valid traceparent and tracestate reach
every leg, over real HTTP to the fake engines; an invalid one reaches none; none is invented."""

from __future__ import annotations

import aiohttp
import pytest

from pd_runtime.proxy.legs import trace_headers
from tests.proxy.conftest import SetupFactory
from tests.proxy.proxy_fakes import FakeEngine, Recorded, proxy_config, start_proxy, wait_for

BODY = {"model": "m", "prompt": "Hello there", "max_tokens": 4}
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

INVALID = [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # uppercase
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 has four fields
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # trace id one digit short
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    f"{PARENT}, {PARENT}",  # the header sent twice
    "",
]


def _trace_of(req: Recorded) -> tuple[str | None, str | None]:
    return req.headers.get("traceparent"), req.headers.get("tracestate")


def test_trace_headers_keep_only_a_valid_context() -> None:
    assert trace_headers({"traceparent": PARENT, "tracestate": STATE}) == {"traceparent": PARENT, "tracestate": STATE}
    assert trace_headers({"traceparent": PARENT}) == {"traceparent": PARENT}
    future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-adds"
    assert trace_headers({"traceparent": future}) == {"traceparent": future}
    for bad in INVALID:
        assert trace_headers({"traceparent": bad, "tracestate": STATE}) == {}, bad
    assert trace_headers({"tracestate": STATE}) == {}  # tracestate only beside a valid traceparent
    assert trace_headers({"traceparent": PARENT, "tracestate": "a=" + "x" * 600}) == {"traceparent": PARENT}
    assert trace_headers({}) == {}


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_client_trace_context_reaches_both_legs(pd_setup: SetupFactory, mode: str) -> None:
    setup = await pd_setup(mode=mode)
    status, _ = await setup.post("/v1/completions", BODY, headers={"traceparent": PARENT, "tracestate": STATE})
    assert status == 200
    (p_req,) = setup.prefill.requests
    (d_req,) = setup.decode.requests
    assert _trace_of(p_req) == _trace_of(d_req) == (PARENT, STATE)


@pytest.mark.parametrize("bad", INVALID[:3])
async def test_invalid_trace_context_reaches_neither_leg(pd_setup: SetupFactory, bad: str) -> None:
    setup = await pd_setup(mode="READ")
    status, _ = await setup.post("/v1/completions", BODY, headers={"traceparent": bad, "tracestate": STATE})
    assert status == 200
    for req in (*setup.prefill.requests, *setup.decode.requests):
        assert _trace_of(req) == (None, None)


async def test_no_trace_context_is_invented(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    status, _ = await setup.stream(BODY)
    assert status == 200
    await wait_for(lambda: bool(setup.prefill.requests), what="the prefill leg")
    for req in (*setup.prefill.requests, *setup.decode.requests):
        assert _trace_of(req) == (None, None)


async def test_colocated_leg_carries_the_trace_context() -> None:
    engine = FakeEngine("E", [])
    await engine.start()
    proxy = await start_proxy(proxy_config(mode="colocated", engines=(f"http://{engine.http_address}",)))
    try:
        await wait_for(lambda: not proxy.not_ready_reason(), what="engine probed healthy")
        async with (
            aiohttp.ClientSession() as client,
            client.post(
                f"http://127.0.0.1:{proxy.api_port}/v1/completions", json=BODY, headers={"traceparent": PARENT}
            ) as resp,
        ):
            assert resp.status == 200
        (req,) = engine.requests
        assert _trace_of(req) == (PARENT, None)
    finally:
        await proxy.stop()
        await engine.stop()
