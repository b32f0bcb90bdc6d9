"""The API port's HTTP/1.1 server, on asyncio protocols.

Why not aiohttp's server here: profiled per request (docs/benchmarks.md, "Proxy"), its request, router,
middleware and response machinery cost about a third of the proxy's CPU, and a wave of requests that
arrive together waits for all of their setup before the median one's first byte. This server does what
the API port needs and no more: keep-alive connections serving one request at a time (pipelined ones
wait their turn), Content-Length and chunked request bodies up to a size limit, ``Expect:
100-continue``, exact-path routes, and answers written straight to the socket (a stream's head goes out
with its first chunk, in one write). A handler runs in its own task, cancelled when the client goes
away, which is how a disconnect reaches the upstream legs. The admin port stays on aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pd_runtime.proxy.chunked import ChunkedDecoder
from pd_runtime.proxy.errors import ApiError
from pd_runtime.proxy.sinks import ClientGone

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
IDLE_TIMEOUT_S = 75.0
"""A keep-alive connection with no request in progress for this long is closed (aiohttp's default)."""
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout",
}  # fmt: skip


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lowercased; repeated headers joined with ", "
    body: bytes
    refused: ApiError | None = None  # a body over the limit: reading it raises this (413)

    def read(self) -> bytes:
        if self.refused is not None:
            raise self.refused
        return self.body


Handler = Callable[[HttpRequest, "ResponseSink"], Awaitable[None]]


class ResponseSink:
    """The Sink of one request: an answer written to its connection (streams chunked)."""

    def __init__(self, conn: _ApiConnection, head_only: bool) -> None:
        self._conn = conn
        self._head_only = head_only
        self._head = b""  # a stream's head, sent with its first chunk
        self.started = False
        self.done = False

    async def begin_stream(self, content_type: str) -> None:
        self.started = True
        if self._conn.http10:  # no chunked coding in HTTP/1.0: the stream ends when the connection does
            self._conn.keep_alive = False
            framing = b""
        else:
            framing = b"Transfer-Encoding: chunked\r\n"
        self._head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n%s%s\r\n" % (
            content_type.encode("latin-1"),
            framing,
            self._conn.connection_header(),
        )

    async def write(self, data: bytes) -> None:
        if not data:
            return
        head, self._head = self._head, b""
        if self._conn.http10:
            self._conn.send(head + data)
        else:
            self._conn.send(b"%s%x\r\n%s\r\n" % (head, len(data), data))
        if self._conn.write_paused:
            await self._conn.drain()

    async def end_stream(self) -> None:
        head, self._head = self._head, b""
        self.done = True
        self._conn.send(head if self._conn.http10 else head + b"0\r\n\r\n")

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        self.answer(status, {"Content-Type": content_type}, body)

    async def error(self, err: ApiError) -> None:
        if self.started:
            await self.write(err.sse_bytes())
            await self.end_stream()
        else:
            self.answer(err.status, err.headers(), err.json_bytes())

    def answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """A complete answer with Content-Length (HEAD: the same head, no body)."""
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}\r\n")
        head = "".join(lines).encode("latin-1") + self._conn.connection_header() + b"\r\n"
        self.started = self.done = True
        self._conn.send(head if self._head_only else head + body)


class _ApiConnection(asyncio.Protocol):
    """One client connection: parse a request, run its handler, answer, then the next one."""

    def __init__(self, server: ApiServer) -> None:
        self._server = server
        self._buffer = b""
        self._discard = 0
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self.write_paused = False
        self._reading_paused = False
        self.closed = False
        self.keep_alive = True
        self.http10 = False
        self.idle_since = time.monotonic()

    # -- protocol callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a TCP transport
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        self._wake_writer()
        if self._task is not None:
            self._task.cancel()  # the client went away: the handler's legs close on the way out

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        if self._discard:  # the rest of a refused body
            drop = min(len(data), self._discard)
            self._discard -= drop
            data = data[drop:]
        self._buffer += data
        if self._task is None:
            self._next_request()
        elif len(self._buffer) > MAX_HEAD_BYTES + self._server.max_body_bytes and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()  # a client pipelining far ahead waits for its answers

    # -- requests ------------------------------------------------------------------------------

    def _next_request(self) -> None:
        """Start the handler of the next complete request in the buffer, if there is one."""
        try:
            request = self._parse()
        except ApiError as err:  # malformed or too large: answered, and the connection is not reused
            self.keep_alive = False
            ResponseSink(self, head_only=False).answer(err.status, err.headers(), err.json_bytes())
            self.close()
            return
        if request is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve(request))

    def _parse(self) -> HttpRequest | None:
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise ApiError(400, "request head over 64 KiB", code="head_too_large")
            return None
        try:
            lines = buffer[:end].decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon or not name or name != name.strip():
                    raise ValueError(line)
                name, value = name.lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        except ValueError as exc:
            raise ApiError(400, "malformed HTTP/1.1 request head", code="bad_request") from exc
        connection = headers.get("connection", "").lower()
        self.http10 = version == "HTTP/1.0"
        self.keep_alive = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        path = target.split("?", 1)[0]
        try:
            body = self._body(headers, buffer, end + 4)
        except _TooLarge as exc:  # answered at once; a Content-Length body is read and dropped as it comes
            if exc.length is None:
                self.keep_alive, self._buffer = False, b""
            else:
                have = len(buffer) - end - 4
                self._buffer = buffer[end + 4 + exc.length :] if have >= exc.length else b""
                self._discard = max(0, exc.length - have)
            return HttpRequest(method, path, headers, b"", refused=exc.error)
        return None if body is None else HttpRequest(method, path, headers, body)

    def _body(self, headers: dict[str, str], buffer: bytes, start: int) -> bytes | None:
        """The body once it is all here (the buffer then holds what follows), None while it is not."""
        limit = self._server.max_body_bytes
        if _framed_by_chunks(headers):
            decoder = ChunkedDecoder()
            try:
                body = decoder.feed(buffer[start:])
            except ValueError as exc:
                raise ApiError(400, f"malformed chunked request body: {exc}", code="bad_request") from exc
            if len(body) > limit:
                raise _TooLarge(limit, None)
            if not decoder.done:
                self._continue(headers)
                return None
            self._buffer = decoder.rest
            return body
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise ApiError(400, "Content-Length is not a number", code="bad_request") from exc
        if length < 0:
            raise ApiError(400, "Content-Length is negative", code="bad_request")
        if length > limit:
            raise _TooLarge(limit, length)
        if len(buffer) - start < length:
            self._continue(headers)
            return None
        self._buffer = buffer[start + length :]
        return buffer[start : start + length]

    def _continue(self, headers: dict[str, str]) -> None:
        """``Expect: 100-continue``: the client waits for this before it sends the body (once)."""
        if headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            headers.pop("expect")
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _serve(self, request: HttpRequest) -> None:
        sink = ResponseSink(self, head_only=request.method == "HEAD")
        try:
            await self._server.dispatch(request, sink)
        except ClientGone:
            self.close()
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            if not sink.started:
                sink.answer(500, {"Content-Type": "application/json"}, _internal_error().json_bytes())
            self.close()
        else:
            if not sink.done:  # a stream the handler left open cannot be ended cleanly
                self.close()
        self._task = None
        self.idle_since = time.monotonic()
        if self.closed:
            return
        if not self.keep_alive or self._server.draining:
            self.close()
            return
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        if self._buffer:
            self._next_request()

    # -- writing -------------------------------------------------------------------------------

    def connection_header(self) -> bytes:
        keep = self.keep_alive and not self._server.draining
        return b"" if keep else b"Connection: close\r\n"

    def send(self, data: bytes) -> None:
        if self.closed or self._transport is None or self._transport.is_closing():
            raise ClientGone
        self._transport.write(data)

    async def drain(self) -> None:
        while self.write_paused and not self.closed:
            self._writable = asyncio.get_running_loop().create_future()
            await self._writable
        if self.closed:
            raise ClientGone

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    @property
    def busy(self) -> bool:
        return self._task is not None

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class ApiServer:
    """Routes exact paths to handlers; ``stop`` drains: no new connections, in-flight answers finish."""

    def __init__(self, routes: dict[str, dict[str, Handler]], max_body_bytes: int) -> None:
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.connections: set[_ApiConnection] = set()
        self.draining = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, sock: socket.socket, backlog: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ApiConnection(self), sock=sock, backlog=backlog)
        self._sweeper = loop.create_task(self._sweep_idle())

    async def dispatch(self, request: HttpRequest, sink: ResponseSink) -> None:
        methods = self.routes.get(request.path)
        if methods is None:
            await sink.error(ApiError(404, "Not Found", code="not_found"))
            return
        handler = methods.get("GET" if request.method == "HEAD" else request.method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            err = ApiError(405, "Method Not Allowed", code="method_not_allowed")
            sink.answer(405, {**err.headers(), "Allow": allow}, err.json_bytes())
            return
        try:
            await handler(request, sink)
        except ApiError as err:
            await sink.error(err)

    async def _sweep_idle(self) -> None:
        while True:
            await asyncio.sleep(IDLE_TIMEOUT_S / 5)
            now = time.monotonic()
            for conn in list(self.connections):
                if not conn.busy and now - conn.idle_since > IDLE_TIMEOUT_S:
                    conn.close()

    async def stop(self, timeout: float) -> None:
        """Stop accepting, close idle connections, give in-flight requests ``timeout`` s, then cut them."""
        self.draining = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + timeout
        while True:
            for conn in list(self.connections):
                if not conn.busy:
                    conn.close()
            if not self.connections or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def _framed_by_chunks(headers: dict[str, str]) -> bool:
    """Whether the body is chunked; framing two readers could disagree on is refused (RFC 9112 6.1, 6.3).

    A request with both Transfer-Encoding and Content-Length, or whose last coding is not chunked, is how
    request smuggling starts when a proxy sits in front of us: answer 400 and close instead of guessing.
    """
    codings = headers.get("transfer-encoding")
    if codings is None:
        return False
    if "content-length" in headers:
        raise ApiError(400, "both Transfer-Encoding and Content-Length", code="bad_request")
    if codings.rsplit(",", 1)[-1].strip().lower() != "chunked":
        raise ApiError(400, f"unsupported Transfer-Encoding {codings!r}", code="bad_request")
    return True


class _TooLarge(Exception):
    """``length``: the Content-Length to drop, None for a chunked body (the connection is closed)."""

    def __init__(self, limit: int, length: int | None) -> None:
        super().__init__(limit)
        self.length = length
        self.error = ApiError(413, f"request body is larger than {limit} bytes", code="body_too_large")


def _internal_error() -> ApiError:
    return ApiError(500, "internal proxy error", type="server_error", code="internal_error")
