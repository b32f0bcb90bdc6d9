"""Registration frames from anyone who reaches the socket, over real ZMQ, against a running proxy.

Told its engines (``--expected-engine``, as the operator renders it) the proxy routes nothing to a
process that announces itself; without the list (a standalone proxy) it keeps discovering engines but
within bounds, and never lets a frame move a known instance's side-channel host.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import msgpack
import pytest

from tests.proxy.conftest import PdSetup, SetupFactory
from tests.proxy.proxy_fakes import FakeEngine, Registrar, wait_for

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}
REQUESTS = 12


def frames(setup: PdSetup, result: str) -> float:
    value: float = setup.proxy.metrics.registration_frames.labels(result)._value.get()
    return value


async def rogue_decode(setup: PdSetup) -> FakeEngine:
    """A process that answers like a decode engine and announces itself, as any local process can."""
    rogue = FakeEngine("D", setup.events, handshake_port=7401, notify_port=7601, tp_size=1)
    await rogue.start()
    setup.extra.append(rogue)
    return rogue


async def serve_requests(setup: PdSetup) -> None:
    for _ in range(REQUESTS):
        status, body = await setup.post("/v1/completions", BODY)
        assert status == 200, body


async def test_a_rogue_decode_never_receives_a_request_when_the_proxy_knows_its_engines(
    pd_setup: SetupFactory,
) -> None:
    setup = await pd_setup(expect=True)
    rogue = await rogue_decode(setup)
    for _ in range(3):
        await setup.registrar.send(rogue.g2_registration())
    await wait_for(lambda: frames(setup, "refused_unknown") >= 1, what="the rogue's frames refused")
    dropped = setup.proxy.metrics.registration_peers_dropped.labels("refused_frame")
    await wait_for(lambda: dropped._value.get() >= 1, what="the rogue's connection shut down")
    await serve_requests(setup)
    assert rogue.requests == [] and len(setup.decode.requests) == REQUESTS
    # the engines' first frames race each other: which one the registry met first is not the point
    assert sorted(setup.proxy.registry.instances) == sorted([setup.prefill.http_address, setup.decode.http_address])


async def test_without_the_list_the_same_rogue_would_be_routed_to(pd_setup: SetupFactory) -> None:
    """The control of the test above: a standalone proxy discovers engines, so the rogue gets its share."""
    setup = await pd_setup()
    rogue = await rogue_decode(setup)
    await setup.registrar.send(rogue.g2_registration())
    await wait_for(lambda: rogue.http_address in {i.key for i in setup.proxy.registry.live("D", time.monotonic())})
    await serve_requests(setup)
    assert len(rogue.requests) == REQUESTS // 2


@pytest.mark.parametrize("expect", [False, True], ids=["discovery", "expected"])
async def test_a_reannounced_prefill_with_another_side_channel_host_does_not_replace_it(
    pd_setup: SetupFactory, expect: bool
) -> None:
    setup = await pd_setup(expect=expect)
    moved: dict[str, Any] = {
        **setup.prefill.g2_registration(),
        "zmq_address": "host:10.6.6.6,handshake:6301,notify:6105",
    }
    await setup.registrar.send(moved)
    await wait_for(lambda: frames(setup, "refused_mismatch") == 1, what="the moved prefill refused")
    assert setup.proxy.registry.instances[setup.prefill.http_address].registration.host == "127.0.0.1"
    status, _ = await setup.post("/v1/completions", BODY)
    assert status == 200
    request_id = setup.decode.requests[-1].headers["X-Request-Id"]
    assert "host:127.0.0.1,handshake:6301" in request_id and "10.6.6.6" not in request_id


async def test_a_frame_announcing_dp_size_a_million_is_refused(pd_setup: SetupFactory) -> None:
    setup = await pd_setup()
    rogue = await rogue_decode(setup)
    await setup.registrar.send({**rogue.g2_registration(), "dp_size": 10**6})
    await wait_for(lambda: frames(setup, "refused_bounds") == 1, what="the oversized frame refused")
    assert rogue.http_address not in setup.proxy.registry.instances
    await serve_requests(setup)
    assert rogue.requests == []


async def test_five_thousand_distinct_frames_leave_status_answering_and_fds_bounded(pd_setup: SetupFactory) -> None:
    setup = await pd_setup()
    fds_before = len(os.listdir("/proc/self/fd"))
    flood = Registrar(setup.proxy.config.registration_address)
    try:
        sender = asyncio.create_task(_flood(flood, setup.decode.g2_registration(), 5000))
        await wait_for(lambda: frames(setup, "rate_limited") > 500, timeout=30, what="the flood being refused")
        async with setup.client.get(setup.admin_url + "/status", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            assert resp.status == 200
            doc = await resp.json()
        await sender
    finally:
        flood.close()
    assert len(doc["instances"]) <= setup.proxy.config.max_instances
    assert len(setup.proxy.registry.instances) <= setup.proxy.config.max_instances
    assert len(os.listdir("/proc/self/fd")) - fds_before < 200  # one probe per admitted instance at most
    status, _ = await setup.post("/v1/completions", BODY)
    assert status == 200


async def _flood(registrar: Registrar, template: dict[str, Any], count: int) -> None:
    """Every frame from one connection, as one process announcing thousands of engines would send them."""
    for i in range(count):
        await registrar.send_raw([msgpack.packb({**template, "http_address": f"127.0.0.1:{10_000 + i}"})])
