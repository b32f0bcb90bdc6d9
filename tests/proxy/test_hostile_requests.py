"""One bad request must not stop the proxy's serving (issue 19): each of these reaches the parser (with
the client key where one is set: without it the head alone is answered 401, issue 28), and /health
answers afterwards.

The waits are generous bounds for a loaded machine, not timings: before the fix the proxy never
answered again after the first of these requests.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.conftest import SetupFactory

NEGATIVE_CHUNK = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1\r\nA\r\n-6\r\n0\r\n\r\n"
)
HIDDEN = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
SMUGGLING = {
    # A front end that ends a field at a bare LF reads Content-Length and sees one request whose body
    # is HIDDEN twice; a parser that splits only at CRLF sees no length and three requests.
    "bare-lf-in-a-field-value": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: a\nContent-Length: %d\r\n\r\n" % (2 * len(HIDDEN))
        + HIDDEN * 2
    ),
    # A bare LF after the version: a front end reads Transfer-Encoding, a lenient parser swallows it
    # into the version and reads the chunked body as the next requests.
    "bare-lf-after-the-version": (
        b"POST /v1/completions HTTP/1.1\nTransfer-Encoding: chunked\r\nHost: x\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(HIDDEN), HIDDEN)
    ),
    "content-length-and-transfer-encoding": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"0\r\n\r\n"
        + HIDDEN
    ),
}


async def _exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data``, then read until the proxy closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def _health(port: int) -> bytes:
    return await _exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5.0)


async def test_a_negative_chunk_size_is_refused_and_the_proxy_keeps_serving(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", api_key="secret")
    answer = await _exchange(setup.proxy.api_port, NEGATIVE_CHUNK)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"chunk size" in answer
    assert (await _health(setup.proxy.api_port)).startswith(b"HTTP/1.1 200 ")
    assert setup.prefill.requests == []


@pytest.mark.parametrize("vector", sorted(SMUGGLING))
async def test_a_smuggled_request_never_runs(pd_setup: SetupFactory, vector: str) -> None:
    setup = await pd_setup(mode="WRITE")
    answer = await _exchange(setup.proxy.api_port, SMUGGLING[vector])
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"Content-Length: ") == 1, answer  # one answer
    assert (await _health(setup.proxy.api_port)).startswith(b"HTTP/1.1 200 ")
    assert setup.prefill.requests == [] and setup.decode.requests == []


async def test_a_mebibyte_of_one_byte_chunks_is_read_in_linear_time(pd_setup: SetupFactory) -> None:
    """The body arrives whole (then fails as JSON), and /health answers while it streams in."""
    setup = await pd_setup(mode="WRITE", api_key="secret")
    port = setup.proxy.api_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    one_byte_chunks = b"1\r\nA\r\n" * 1024
    for i in range(1024):
        writer.write(one_byte_chunks)
        await writer.drain()
        if i == 512:
            assert (await _health(port)).startswith(b"HTTP/1.1 200 ")
    writer.write(b"0\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 400 ")
    writer.close()
    assert (await _health(port)).startswith(b"HTTP/1.1 200 ")
