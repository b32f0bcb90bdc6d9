"""The API port's HTTP/1.1 server, spoken to over a real socket with hand-written bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from pd_runtime.localports import bound_socket
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.http1 import ApiServer, HttpRequest, ResponseSink
from pd_runtime.proxy.server import api_limits

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class Handlers:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()

    async def echo(self, request: HttpRequest, sink: ResponseSink) -> None:
        body = bytes(request.body)  # whole() takes bytes: a compiled build checks it
        self.bodies.append(body)
        await sink.whole(200, "text/plain", body)

    async def hello(self, request: HttpRequest, sink: ResponseSink) -> None:
        await sink.whole(200, "text/plain", b"hello")

    async def stream(self, request: HttpRequest, sink: ResponseSink) -> None:
        await sink.begin_stream("text/event-stream")
        for word in (b"one", b"two"):
            await sink.write(b"data: " + word + b"\n\n")
        await sink.end_stream()

    async def slow(self, request: HttpRequest, sink: ResponseSink) -> None:
        await asyncio.sleep(0.3)
        await sink.whole(200, "text/plain", b"slow")

    async def hang(self, request: HttpRequest, sink: ResponseSink) -> None:
        self.entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@pytest.fixture
async def served() -> AsyncIterator[tuple[Handlers, Connect]]:
    handlers = Handlers()
    routes = {"/echo": {"POST": handlers.echo}, "/stream": {"GET": handlers.stream}, "/hang": {"GET": handlers.hang}}
    routes["/hello"] = {"GET": handlers.hello}
    routes["/slow"] = {"GET": handlers.slow}
    server = ApiServer(routes, api_limits(ProxyConfig(max_body_bytes=64)))  # type: ignore[dict-item]
    sock = bound_socket()
    port = sock.getsockname()[1]
    await server.start(sock, 16)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port)

    yield handlers, connect
    await server.stop(1.0)


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One Content-Length answer: its head and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await reader.readexactly(length)


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_pipelined_requests_are_answered_in_order_on_one_connection(served: tuple[Handlers, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(_post(b"first") + _post(b"second"))
    assert (await _answer(reader))[1] == b"first"
    assert (await _answer(reader))[1] == b"second"
    writer.close()


async def test_a_chunked_body_split_anywhere_arrives_whole(served: tuple[Handlers, Connect]) -> None:
    handlers, connect = served
    reader, writer = await connect()
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n"
    for i in range(0, len(raw), 5):
        writer.write(raw[i : i + 5])
        await writer.drain()
        await asyncio.sleep(0.001)
    assert (await _answer(reader))[1] == b"abcdefg"
    assert handlers.bodies == [b"abcdefg"]
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body_is_sent(served: tuple[Handlers, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"ok")
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"ok"
    writer.close()


async def test_a_body_over_the_limit_gets_413_and_the_connection_stays_usable(
    served: tuple[Handlers, Connect],
) -> None:
    handlers, connect = served
    reader, writer = await connect()
    writer.write(_post(b"x" * 100)[:-60])  # the head and part of the body: refused before the rest
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in body
    writer.write(b"x" * 60 + _post(b"next"))  # the rest of the refused body is dropped, then the next request
    assert (await _answer(reader))[1] == b"next"
    assert handlers.bodies == [b"next"]
    writer.close()


async def test_a_malformed_head_gets_400_and_a_closed_connection(served: tuple[Handlers, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(b"NONSENSE\r\n\r\n")
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in head and b'"error"' in body
    assert await asyncio.wait_for(reader.read(), 5) == b""


@pytest.mark.parametrize(
    "framing",
    [b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", b"Transfer-Encoding: gzip\r\n"],
    ids=["te-and-cl", "te-not-chunked"],
)
async def test_ambiguous_body_framing_gets_400_and_a_closed_connection(
    served: tuple[Handlers, Connect], framing: bytes
) -> None:
    handlers, connect = served
    reader, writer = await connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n4\r\nnext\r\n0\r\n\r\n")
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in head and b"Transfer-Encoding" in body
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert handlers.bodies == []


async def test_unknown_paths_wrong_methods_and_head(served: tuple[Handlers, Connect]) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 404 ") and b"not_found" in body
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 405 ") and b"Allow: POST" in head and b"method_not_allowed" in body
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # HEAD: GET's head, no body
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 5" in head
    assert await _answer(reader) == (head, b"hello")
    writer.close()


async def test_a_stream_is_chunked_for_http_1_1_and_close_delimited_for_http_1_0(
    served: tuple[Handlers, Connect],
) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 5)  # the server closes after the answer
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head  # HTTP/1.0: close-delimited
    assert body == b"data: one\n\ndata: two\n\n"
    reader, writer = await connect()
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"Transfer-Encoding: chunked" in head and b"Connection" not in head
    assert await reader.readuntil(b"0\r\n\r\n") == b"b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\n0\r\n\r\n"
    writer.close()


async def test_a_client_that_leaves_cancels_its_handler(served: tuple[Handlers, Connect]) -> None:
    handlers, connect = served
    _, writer = await connect()
    writer.write(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(handlers.entered.wait(), 5)
    writer.close()
    await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def _refused(reader: asyncio.StreamReader, status: int, code: bytes) -> None:
    """The connection's last answer: ``status`` with ``code``, then the server closes."""
    head, body = await _answer(reader)
    assert head.startswith(b"HTTP/1.1 %d " % status) and b"Connection: close" in head and code in body, (head, body)
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_half_closed_client_still_gets_its_answers(served: tuple[Handlers, Connect]) -> None:
    """netcat-style: the request, then SHUT_WR; the answers come (after 100 Continue probes), then the close."""
    _, connect = served
    reader, writer = await connect()
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    writer.write_eof()
    raw = await asyncio.wait_for(reader.read(), 5)
    answers = [part for part in raw.split(b"HTTP/1.1 ") if part and not part.startswith(b"100 Continue")]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"200 OK", b"200 OK"]
    assert answers[0].endswith(b"\r\n\r\nslow") and answers[1].endswith(b"\r\n\r\nhello")


async def test_the_head_limit_holds_with_or_without_the_terminator(served: tuple[Handlers, Connect]) -> None:
    _, connect = served
    big = b"X-Big: " + b"b" * (70 * 1024) + b"\r\n"
    reader, writer = await connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")  # the whole head in one write
    await _refused(reader, 431, b"head_too_large")
    reader, writer = await connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n" + big)  # no terminator: refused all the same
    await _refused(reader, 431, b"head_too_large")
    reader, writer = await connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n" + b"X-Many: v\r\n" * 8000)  # many small fields
    await _refused(reader, 431, b"head_too_large")


async def test_chunk_extensions_trailers_and_framing_are_bounded(served: tuple[Handlers, Connect]) -> None:
    """Refused while the client is still sending: nothing of it is buffered past the limits."""
    handlers, connect = served
    chunked = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    reader, writer = await connect()
    writer.write(chunked + b"1;" + b"e" * (64 * 1024))  # a chunk extension that never ends
    await _refused(reader, 400, b"chunk extension or trailer section too long")
    reader, writer = await connect()
    writer.write(chunked + b"1\r\na\r\n0\r\n" + b"T: v\r\n" * 4000)  # trailer fields past 16 KiB
    await _refused(reader, 400, b"bad_request")  # they are framing too: whichever bound they pass first
    reader, writer = await connect()
    # body bytes far apart: each chunk's extension is short, their sum is not
    writer.write(chunked + b"".join(b"1;%s\r\na\r\n" % (b"e" * 8000) for _ in range(32)))
    await _refused(reader, 400, b"framing far larger than the body")
    assert handlers.bodies == []


@pytest.mark.parametrize(
    ("framing", "status", "needle"),
    [
        (b"Transfer-Encoding: gzip\r\n", 400, b"does not end in chunked"),
        (b"Transfer-Encoding: chunked, chunked\r\n", 400, b"Transfer-Encoding"),
        (b"Transfer-Encoding: gzip, chunked\r\n", 501, b"not_implemented"),
        (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501, b"not_implemented"),
    ],
    ids=["gzip", "chunked-twice", "gzip-chunked", "two-fields"],
)
async def test_transfer_codings_other_than_chunked_are_refused(
    served: tuple[Handlers, Connect], framing: bytes, status: int, needle: bytes
) -> None:
    handlers, connect = served
    reader, writer = await connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n4\r\nnext\r\n0\r\n\r\n")
    await _refused(reader, status, needle)
    assert handlers.bodies == []


@pytest.mark.parametrize(
    "head",
    [b"GET /hello HTTP/1.1\r\n\r\n", b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"],
    ids=["no-host", "two-hosts"],
)
async def test_an_http_1_1_request_needs_exactly_one_host(served: tuple[Handlers, Connect], head: bytes) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(head)
    await _refused(reader, 400, b"Host")
    reader, writer = await connect()
    writer.write(b"GET /hello HTTP/1.0\r\n\r\n")  # HTTP/1.0 has no Host requirement
    assert (await _answer(reader))[1] == b"hello"


@pytest.mark.parametrize(
    ("head", "needle"),
    [
        (b"GET /hello HTTP/1.1\r\nHost: a b\r\n\r\n", b"invalid Host"),
        (b"GET /hello HTTP/1.1\r\nHost: user@a\r\n\r\n", b"invalid Host"),
        (b"GET /hello HTTP/1.1\r\nHost: a:1:2\r\n\r\n", b"invalid Host"),
        (b"GET  /hello HTTP/1.1\r\nHost: x\r\n\r\n", b"malformed request line"),
        (b"GET /hello  HTTP/1.1\r\nHost: x\r\n\r\n", b"malformed request line"),
    ],
    ids=["host-space", "host-userinfo", "host-two-ports", "two-spaces-before-target", "two-spaces-before-version"],
)
async def test_an_invalid_host_or_request_line_gets_400(
    served: tuple[Handlers, Connect], head: bytes, needle: bytes
) -> None:
    _, connect = served
    reader, writer = await connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: [::1]:80\r\n\r\n" + head)  # one by one, well-formed first
    assert (await _answer(reader))[1] == b"hello"
    await _refused(reader, 400, needle)


async def test_pipelined_requests_before_a_malformed_one_are_answered_first(
    served: tuple[Handlers, Connect],
) -> None:
    handlers, connect = served
    reader, writer = await connect()
    writer.write(_post(b"one") + _post(b"two") + b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n")
    assert (await _answer(reader))[1] == b"one"
    assert (await _answer(reader))[1] == b"two"
    await _refused(reader, 400, b"Content-Length")
    assert handlers.bodies == [b"one", b"two"]


async def test_nothing_after_a_connection_close_request_is_read(served: tuple[Handlers, Connect]) -> None:
    handlers, connect = served
    reader, writer = await connect()
    writer.write(_post(b"last", b"Connection: close\r\n") + _post(b"never"))
    head, body = await _answer(reader)
    assert body == b"last" and b"Connection: close" in head
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert handlers.bodies == [b"last"]


async def test_a_body_over_the_limit_is_refused_before_the_handler_runs(served: tuple[Handlers, Connect]) -> None:
    """Limits hold before any handler (and so before authentication); a chunked one closes."""
    handlers, connect = served
    reader, writer = await connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"10\r\n" + b"z" * 16 + b"\r\n")
    writer.write((b"10\r\n" + b"z" * 16 + b"\r\n") * 4)  # 80 bytes, the limit is 64
    await _refused(reader, 413, b"body_too_large")
    assert handlers.bodies == []
