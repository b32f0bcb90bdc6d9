"""Property-based fuzzing (hypothesis) of both HTTP paths the proxy parses (issue 19): client requests
into the API port's server, and engines' answers into the legs' client. Whatever the bytes, the
exchange ends (no hang), nothing but the expected errors comes out (no crash), and the memory the
exchange allocates stays bounded however much is sent (tracemalloc's peak, not the input's size).

The inputs are built from the pieces HTTP/1.1 is made of, corrupted the ways the differential vectors
are (bare LF and CR, NUL, signed and prefixed numbers, codings, floods of one field), so most examples
reach the body and chunk parsers instead of failing at the first byte. Derandomized: CI runs the same
examples every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tracemalloc
from collections.abc import Iterator

import httptools
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pd_runtime.localports import bound_socket
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.http1 import ApiServer, HttpRequest, ResponseSink
from pd_runtime.proxy.server import api_limits
from pd_runtime.proxy.upstream import UpstreamError, UpstreamPool

EXAMPLES = 60
MEMORY_BOUND = 2 * 1024 * 1024
"""Bytes the exchange may allocate at its peak; the floods send up to 4 MiB."""
MAX_BODY = 64 * 1024
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

EOLS = st.sampled_from([b"\r\n"] * 6 + [b"\n", b"\r", b"\r\r\n", b""])
NUMBERS = st.sampled_from(
    [b"0", b"5", b"16", b"+5", b"-6", b"0x5", b"0_5", b"5\x0b", b"5, 5", b" 5", b"ffffffffffffffffff"]
)
VALUES = st.one_of(
    st.sampled_from([b"x", b"chunked", b"gzip, chunked", b"chunked, chunked", b"close", b"100-continue"]),
    NUMBERS,
    st.binary(max_size=12),
)
NAMES = st.one_of(
    st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect", b"X-A"]),
    st.binary(min_size=1, max_size=8),
)
FLOOD = st.tuples(st.sampled_from([b"e", b" ", b"\r\n", b"1\r\nA\r\n", b"X-A: v\r\n", b"0;"]), st.integers(0, 1 << 20))


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    """A chunked body: sizes that are right, wrong or malformed, extensions, a last chunk, trailers."""
    out = b""
    for data in draw(st.lists(st.binary(max_size=40), max_size=5)):
        size = draw(st.one_of(st.just(b"%x" % len(data)), NUMBERS))
        ext = draw(st.sampled_from([b"", b";a=b", b";" + b"e" * 50]))
        out += size + ext + draw(EOLS) + data + draw(EOLS)
    if draw(st.booleans()):
        out += b"0" + draw(EOLS) + b"".join(draw(st.lists(st.just(b"T: v\r\n"), max_size=2))) + draw(EOLS)
    return out


@st.composite
def flood(draw: st.DrawFn) -> bytes:
    piece, times = draw(FLOOD)
    return piece * (times if draw(st.booleans()) else times % 64)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"FROB", b"G@T"]))
    target = draw(st.sampled_from([b"/echo", b"/echo?q", b"http://x/echo", b"/a b", b"*", b"/\x00"]))
    version = draw(st.sampled_from([b"HTTP/1.1"] * 4 + [b"HTTP/1.0", b"HTTP/1.1x", b"HTTP/2.0", b"http/1.1"]))
    head = method + b" " + target + b" " + version + draw(EOLS)
    for name, value in draw(st.lists(st.tuples(NAMES, VALUES), max_size=6)):
        head += name + b": " + value + draw(EOLS)
    body = draw(st.one_of(chunks(), st.binary(max_size=60)))
    one = head + draw(EOLS) + body + draw(flood())
    return one * draw(st.integers(1, 3))


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    status = draw(
        st.sampled_from(
            [
                b"HTTP/1.1 200 OK",
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
                b"HTTP/1.0 200 OK",
                b"HTTP/1.1 2000 X",
                b"SSH-2.0",
            ]
        )
    )
    head = status + draw(EOLS)
    framing = draw(
        st.sampled_from(
            [
                b"Transfer-Encoding: chunked",
                b"Content-Length: 5",
                b"Content-Length: -5",
                b"Transfer-Encoding: gzip",
                b"",
            ]
        )
    )
    head += framing + draw(EOLS)
    for name, value in draw(st.lists(st.tuples(NAMES, VALUES), max_size=3)):
        head += name + b": " + value + draw(EOLS)
    return head + draw(EOLS) + draw(st.one_of(chunks(), st.binary(max_size=60))) + draw(flood())


@pytest.fixture(scope="module")
def traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def _peak_after(coroutine_factory: object) -> int:
    """Run the exchange in a fresh loop; the peak it allocated above what was live before it."""
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    asyncio.run(coroutine_factory())  # type: ignore[operator]
    return tracemalloc.get_traced_memory()[1] - before


async def _echo(request: HttpRequest, sink: ResponseSink) -> None:
    await sink.whole(200, "text/plain", b"%d" % len(request.body))


async def _send_request(data: bytes) -> None:
    server = ApiServer({"/echo": {"GET": _echo, "POST": _echo}}, api_limits(ProxyConfig(max_body_bytes=MAX_BODY)))
    listening = bound_socket()
    await server.start(listening, 16)
    loop = asyncio.get_running_loop()
    client = socket.create_connection(listening.getsockname())
    client.setblocking(False)
    try:
        async with asyncio.timeout(20):  # no hang: the server answers and closes, whatever it got
            with contextlib.suppress(ConnectionError):  # refused mid-send: the rest is not read
                await loop.sock_sendall(client, data)
            client.shutdown(socket.SHUT_WR)
            received = bytearray()
            with contextlib.suppress(ConnectionError):
                while piece := await loop.sock_recv(client, 65536):
                    received += piece
        statuses = _statuses(bytes(received))
        assert set(statuses) <= {200, 400, 404, 405, 413, 431, 501, 505}, statuses
        assert len(server.connections) <= 1
    finally:
        client.close()
        await server.stop(1.0)


def _statuses(raw: bytes) -> list[int]:
    """What the server answered, read by llhttp: it must be well-formed HTTP."""
    statuses: list[int] = []

    class Answers:
        def on_message_complete(self) -> None:
            statuses.append(parser.get_status_code())

    parser = httptools.HttpResponseParser(Answers())
    parser.feed_data(raw)
    return [status for status in statuses if status >= 200]


NEGATIVE_CHUNK = b"1\r\nA\r\n-6\r\n0\r\n\r\n"  # the body that froze the hand-written decoder
CHUNKED_REQUEST = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED_ANSWER = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@FUZZ
@given(data=requests())
@example(data=CHUNKED_REQUEST + NEGATIVE_CHUNK)
@example(data=CHUNKED_REQUEST + b"1;" + b"e" * (4 << 20))  # a chunk extension that never ends
@example(data=b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: " + b"v" * (4 << 20))  # a head that never ends
def test_any_request_bytes_end_in_answers_with_bounded_memory(traced: None, data: bytes) -> None:
    assert _peak_after(lambda: _send_request(data)) < MEMORY_BOUND


async def _read_answer(answer: bytes) -> None:
    """A fake engine answers ``answer`` to the leg and closes; the leg reads it to the end or fails."""
    loop = asyncio.get_running_loop()
    engine = bound_socket()
    engine.listen(4)
    engine.setblocking(False)
    host, port = engine.getsockname()

    async def serve() -> None:
        conn, _ = await loop.sock_accept(engine)
        with conn, contextlib.suppress(ConnectionError):
            request = b""
            while not request.endswith(b"{}"):
                request += await loop.sock_recv(conn, 4096)
            await loop.sock_sendall(conn, answer)

    engine_task = asyncio.create_task(serve())
    pool = UpstreamPool(connect_timeout=5, keepalive_s=1)
    try:
        async with asyncio.timeout(20):  # no hang: the answer ends, breaks, or the engine's close ends it
            with contextlib.suppress(UpstreamError):
                async with pool.post(host, port, "/v1/completions", {}, b"{}") as resp:
                    while await resp.read_some():
                        pass
            await engine_task
    finally:
        pool.close()
        engine_task.cancel()
        engine.close()


@FUZZ
@given(answer=answers())
@example(answer=CHUNKED_ANSWER + NEGATIVE_CHUNK)
@example(answer=CHUNKED_ANSWER + b"1\r\nA\r\n0\r\nT: " + b"v" * (4 << 20))  # a trailer field that never ends
def test_any_engine_answer_ends_the_leg_with_bounded_memory(traced: None, answer: bytes) -> None:
    assert _peak_after(lambda: _read_answer(answer)) < MEMORY_BOUND
