"""What the API port holds before a request is authenticated, and its bounds (issue 28): the key is checked
on the head, before any body byte is read."""

from __future__ import annotations

import asyncio

from tests.proxy.conftest import SetupFactory

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
