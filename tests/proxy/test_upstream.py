"""The legs' HTTP/1.1 client against real sockets: framing, keep-alive, broken and abandoned answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest

from pd_runtime.localports import bound_socket
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool
from tests.ports import TEST_PORTS

Serve = Callable[["RawServer"], Awaitable[int]]


class RawServer:
    """Answers each request on a connection with the bytes of ``answers`` in turn, in pieces of ``step`` bytes."""

    def __init__(self, answers: list[bytes], step: int = 0, close_after: bool = False) -> None:
        self.answers = answers
        self.step = step
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.disconnected = asyncio.Event()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers[(len(self.requests) - 1) % len(self.answers)]
                step = self.step or len(answer)
                for start in range(0, len(answer), step):
                    writer.write(answer[start : start + step])
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.disconnected.set()


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(raw: RawServer) -> int:
        sock = bound_socket()
        raw.port = sock.getsockname()[1]
        servers.append(await asyncio.start_server(raw.handle, sock=sock))
        return raw.port

    yield start
    for server in servers:
        server.close()


def _chunked(*events: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + b"0\r\n\r\n"
    )


def _json(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def _stream(pool: UpstreamPool, port: int) -> tuple[int, str, bytes]:
    async with pool.post("127.0.0.1", port, "/v1/completions", {"X-Request-Id": "r1"}, b"{}") as resp:
        pieces = []
        while data := await resp.read_some():
            pieces.append(data)
        return resp.status, resp.headers["content-type"], b"".join(pieces)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 0])
async def test_chunked_body_arrives_whole_however_the_bytes_are_split(serve: Serve, step: int) -> None:
    events = [b"data: one\n\n", b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
    raw = RawServer([_chunked(*events)], step=step)
    port = await serve(raw)
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    assert await _stream(pool, port) == (200, "text/event-stream", b"".join(events))
    assert await _stream(pool, port) == (200, "text/event-stream", b"".join(events))
    assert raw.connections == 1  # read to the end: the connection was reused
    request = raw.requests[0]
    assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:%d\r\n" % port in request and b"\r\nX-Request-Id: r1\r\n" in request
    assert request.endswith(b"\r\n\r\n{}")
    pool.close()


async def test_content_length_and_close_delimited_bodies(serve: Serve) -> None:
    port = await serve(RawServer([_json(b'{"a": 1}'), _json(b"", b"Connection: close\r\n")], step=3))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    async with pool.post("127.0.0.1", port, "/p", {}, b"{}") as resp:
        assert (resp.status, await resp.read()) == (200, b'{"a": 1}')
    async with pool.post("127.0.0.1", port, "/p", {}, b"{}") as resp:
        assert (resp.status, await resp.read()) == (200, b"")
    close_delimited = RawServer(
        [b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\nno engine"], close_after=True
    )
    other = await serve(close_delimited)
    async with pool.post("127.0.0.1", other, "/p", {}, b"{}") as resp:
        assert (resp.status, await resp.read()) == (502, b"no engine")
    pool.close()


async def test_connection_closed_mid_answer_is_broken_and_before_answer_unreachable(serve: Serve) -> None:
    truncated = _chunked(b"data: one\n\n", b"data: two\n\n")[:-20]
    port = await serve(RawServer([truncated], close_after=True))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    with pytest.raises(UpstreamError) as broken:
        await _stream(pool, port)
    assert broken.value.answered
    silent = await serve(RawServer([b""], close_after=True))
    with pytest.raises(UpstreamError) as closed:
        await _stream(pool, silent)
    assert not closed.value.answered
    with pytest.raises(UpstreamError) as refused:
        await _stream(pool, TEST_PORTS.port())  # held, never listening: refused
    assert not refused.value.answered
    garbage = await serve(RawServer([b"SSH-2.0-OpenSSH\r\n\r\n"]))
    with pytest.raises(UpstreamError):
        await _stream(pool, garbage)
    pool.close()


async def test_an_abandoned_answer_closes_its_connection(serve: Serve) -> None:
    """How vLLM learns that the client went away: the leg's connection closes, it is never reused."""
    raw = RawServer([_chunked(*[b"data: x\n\n"] * 50)], step=20)
    port = await serve(raw)
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    async with pool.post("127.0.0.1", port, "/v1/completions", {}, b"{}") as resp:
        assert await resp.read_some()
    await asyncio.wait_for(raw.disconnected.wait(), 5)
    await _stream(pool, port)
    assert raw.connections == 2
    pool.close()


async def test_a_line_break_in_a_header_value_is_refused() -> None:
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    with pytest.raises(ValueError, match="line break"):
        pool.post("127.0.0.1", 1, "/p", {"X-Request-Id": "a\r\nEvil: 1"}, b"{}")


async def test_a_slow_reader_pauses_the_socket_and_still_gets_every_byte(serve: Serve) -> None:
    events = [b"data: %d %s\n\n" % (i, b"y" * 4000) for i in range(300)]  # about 1.2 MB, past PAUSE_BYTES
    port = await serve(RawServer([_chunked(*events)]))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    async with pool.post("127.0.0.1", port, "/v1/completions", {}, b"{}") as resp:
        await asyncio.sleep(0.2)  # the engine writes everything meanwhile; the client stops reading
        received = []
        while data := await resp.read_some():
            received.append(data)
    assert b"".join(received) == b"".join(events)
    pool.close()


async def test_a_negative_chunk_size_fails_the_leg_at_once(serve: Serve) -> None:
    """The request that froze the hand-written decoder, from an engine: llhttp refuses it."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n-6\r\n0\r\n\r\n"
    port = await serve(RawServer([answer, _chunked(b"data: ok\n\n")]))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    with pytest.raises(UpstreamError, match="chunk size") as broken:
        await asyncio.wait_for(_stream(pool, port), 5)
    assert broken.value.answered
    assert await _stream(pool, port) == (200, "text/event-stream", b"data: ok\n\n")  # a new connection
    pool.close()


async def test_an_idle_pooled_connection_closes_at_the_keepalive_time(serve: Serve) -> None:
    """Closed by the pool's timer, not when next used: the engine sees the close with no request sent."""
    raw = RawServer([_json(b"{}")])
    port = await serve(raw)
    pool = UpstreamPool(connect_timeout=2, keepalive_s=0.2)
    async with pool.post("127.0.0.1", port, "/p", {}, b"{}") as resp:
        assert await resp.read() == b"{}"
    await asyncio.wait_for(raw.disconnected.wait(), 10)
    assert raw.connections == 1 and len(raw.requests) == 1
    async with pool.post("127.0.0.1", port, "/p", {}, b"{}") as resp:  # the next leg opens a new one
        assert await resp.read() == b"{}"
    assert raw.connections == 2
    pool.close()


async def test_a_response_head_that_never_ends_fails_the_leg(serve: Serve) -> None:
    port = await serve(RawServer([b"HTTP/1.1 200 OK\r\nX-A: " + b"v" * (1 << 20)]))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    with pytest.raises(UpstreamError, match="64 KiB"):
        await asyncio.wait_for(_stream(pool, port), 5)
    pool.close()


def _keep(received: list[bytes], data: bytes) -> bool:
    received.append(data)
    return True


async def test_forward_hands_every_byte_over_from_the_callback_and_reuses_the_connection(serve: Serve) -> None:
    """The relay's path after a stream's first chunk: far more body than the 64 KiB framing bound, in
    pieces, delivered without buffering; the connection goes back to the pool at the end."""
    events = [b"data: %d %s\n\n" % (i, b"z" * 500) for i in range(400)]  # about 200 KB
    raw = RawServer([_chunked(*events)], step=700)
    port = await serve(raw)
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    for _ in range(2):
        received: list[bytes] = []
        async with pool.post("127.0.0.1", port, "/v1/completions", {}, b"{}") as resp:
            assert await resp.forward(partial(_keep, received))
        assert b"".join(received) == b"".join(events)
    assert raw.connections == 1
    pool.close()


async def test_forward_stops_when_the_receiver_is_full_and_resumes_with_nothing_lost(serve: Serve) -> None:
    events = [b"data: %d\n\n" % i for i in range(200)]
    port = await serve(RawServer([_chunked(*events)], step=30))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    received: list[bytes] = []
    halts = 0
    async with pool.post("127.0.0.1", port, "/v1/completions", {}, b"{}") as resp:

        def deliver(data: bytes) -> bool:
            received.append(data)
            return len(received) % 5 != 0  # full after every fifth read

        while not await resp.forward(deliver):
            halts += 1
            await asyncio.sleep(0.001)  # the client drains; the engine's bytes wait in the buffer
    assert b"".join(received) == b"".join(events)
    assert halts > 0
    pool.close()


async def test_forward_raises_when_the_engine_breaks_mid_answer(serve: Serve) -> None:
    broken = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n"
    port = await serve(RawServer([broken], close_after=True))
    pool = UpstreamPool(connect_timeout=2, keepalive_s=4)
    received: list[bytes] = []
    async with pool.post("127.0.0.1", port, "/v1/completions", {}, b"{}") as resp:
        with pytest.raises(UpstreamError, match="mid-answer"):
            await resp.forward(partial(_keep, received))
    assert received == [b"data: a\n\n"]
    pool.close()
