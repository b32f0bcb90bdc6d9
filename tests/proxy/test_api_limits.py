"""What the API port holds before a request is authenticated, and its bounds (issue 28): the key is checked
on the head, before any body byte is read."""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.conftest import PdSetup, SetupFactory
from tests.proxy.proxy_fakes import wait_for

BODY = {"model": "m", "prompt": "hi", "max_tokens": 4}
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n"


async def _head_of_answer(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)


async def test_a_request_without_the_key_is_answered_401_before_its_body_is_sent(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", api_key="secret")
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.api_port)
    writer.write(HEAD % (1024 * 1024, b"Authorization: Bearer wrong\r\n"))  # the head only: no body byte sent
    head = await _head_of_answer(reader)
    assert head.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in head
    writer.close()
    text = await (await setup.client.get(setup.admin_url + "/metrics")).text()
    assert 'pd_proxy_api_refusals_total{reason="unauthenticated"} 1.0' in text
    assert setup.prefill.requests == []


async def test_the_probes_need_no_key_and_take_no_body(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", api_key="secret")
    async with setup.client.get(setup.url + "/health") as resp:
        assert resp.status == 200
    async with setup.client.get(setup.url + "/v1/models") as resp:
        assert resp.status == 401
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.api_port)
    writer.write(b"GET /ready HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
    assert (await _head_of_answer(reader)).startswith(b"HTTP/1.1 413 ")
    writer.close()


async def test_bodies_past_the_budget_get_503_and_the_budget_comes_back(pd_setup: SetupFactory) -> None:
    """Slow authenticated bodies: the one that would take the held bytes past --body-budget-bytes is
    refused; once a holder leaves, its bytes are free for the next request."""
    setup = await pd_setup(mode="WRITE", api_key="secret", max_body_bytes=64 * 1024, body_budget_bytes=100 * 1024)
    port = setup.proxy.api_port
    key = b"Authorization: Bearer secret\r\n"
    holders = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEAD % (64 * 1024, key) + b"x" * (48 * 1024))  # 48 KiB of 64 held: 96 KiB in all
        holders.append((reader, writer))
    await wait_for(lambda: _held(setup) == 96 * 1024, what="the bodies read")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD % (64 * 1024, key) + b"x" * (8 * 1024))
    head = await _head_of_answer(reader)
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head and b"Connection: close" in head
    assert await asyncio.wait_for(reader.read(), 10) and _held(setup) == 96 * 1024
    holders[0][1].close()
    await wait_for(lambda: _held(setup) == 48 * 1024, what="the budget released")
    status, _ = await setup.post("/v1/completions", BODY, headers={"Authorization": "Bearer secret"})
    assert status == 200
    text = await (await setup.client.get(setup.admin_url + "/metrics")).text()
    assert 'pd_proxy_api_refusals_total{reason="body_budget"} 1.0' in text
    holders[1][1].close()


def _held(setup: PdSetup) -> float | None:
    return setup.proxy.metrics.registry.get_sample_value("pd_proxy_request_bytes_held")


async def test_connections_past_the_cap_get_503_and_are_closed(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", max_connections=2)
    port = setup.proxy.api_port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    await wait_for(lambda: _connections(setup) == 2, what="two connections accepted")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = await _head_of_answer(reader)
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head and b"Connection: close" in head
    assert b"connection_cap" in await asyncio.wait_for(reader.read(), 10)
    writer.close()
    held[0][1].close()
    await wait_for(lambda: _connections(setup) == 1, what="a connection closed")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await _head_of_answer(reader)).startswith(b"HTTP/1.1 200 ")
    text = await (await setup.client.get(setup.admin_url + "/metrics")).text()
    assert 'pd_proxy_api_refusals_total{reason="connection_cap"} 1.0' in text
    writer.close()
    held[1][1].close()


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost"], ids=["silent", "unfinished-head"])
async def test_a_head_not_complete_in_time_gets_408(pd_setup: SetupFactory, sent: bytes) -> None:
    setup = await pd_setup(mode="WRITE", head_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.api_port)
    writer.write(sent)
    head = await _head_of_answer(reader)
    assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
    assert b"head_timeout" in await asyncio.wait_for(reader.read(), 10)
    writer.close()


async def test_the_head_deadline_counts_from_a_request_s_first_byte(pd_setup: SetupFactory) -> None:
    """A keep-alive connection idle between requests is not late: its next head is due from its first byte."""
    setup = await pd_setup(mode="WRITE", head_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.api_port)
    for _ in range(2):
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await _head_of_answer(reader)
        assert head.startswith(b"HTTP/1.1 200 ")
        await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        await asyncio.sleep(0.5)
    writer.close()


def _connections(setup: PdSetup) -> float | None:
    return setup.proxy.metrics.registry.get_sample_value("pd_proxy_client_connections")
