"""The API port's HTTP/1.1 server, on asyncio protocols; requests are parsed by llhttp (httptools).

Why not aiohttp's server here: profiled per request (docs/benchmarks.md, "Proxy"), its request, router,
middleware and response machinery cost about a third of the proxy's CPU, and a wave of requests that
arrive together waits for all of their setup before the median one's first byte. This server does what
the API port needs and no more: keep-alive connections serving one request at a time (pipelined ones
wait their turn), Content-Length and chunked request bodies up to a size limit, ``Expect:
100-continue``, exact-path routes, and answers written straight to the socket (a stream's head goes out
with its first chunk, in one write). A handler runs in its own task, cancelled when the client goes
away, which is how a disconnect reaches the upstream legs. The admin port stays on aiohttp.

The bytes are parsed by llhttp, Node.js's parser (through httptools, as uvicorn does), in its strict
mode: what RFC 9110/9112 say a server MUST reject is a 400 (an unsupported transfer coding a 501) and
closes the connection. This module keeps the connection and flow logic: the limits, checked on every
read before any handler runs (request line and headers, a body's size, a chunked body's framing and
trailers), the server's head check (the proxy's client key: a refused request's body is never read),
the queue of pipelined requests, the answers, and a client that half-closes after sending.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httptools

from pd_runtime.proxy.errors import ApiError, unavailable
from pd_runtime.proxy.sinks import ClientGone

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""Request line and header fields: 431 past it."""
MAX_CHUNK_GAP_BYTES = 16 * 1024
"""Bytes in a row of a chunked body that carry no body byte (a chunk-size line with its extensions, the
trailer section): 400 past it, as Node.js bounds chunk extensions."""
MAX_FRAMING_PER_BODY_BYTE = 8
"""A chunked body's framing (size lines, extensions, CRLFs) may be this many times its decoded size, plus
MAX_CHUNK_GAP_BYTES; 1-byte chunks need 5. Past it: 400, so parsing work stays linear in the body."""
FEED_SLICE_BYTES = 4096
"""The parser is fed at most this much at a time (a Content-Length body: to its end in one go)."""
MAX_QUEUED_REQUESTS = 64
"""Pipelined requests parsed ahead of their answers before the connection stops being read."""
EOF_PROBE_S = 1.0
"""How often a request of a half-closed connection is probed while its answer has not started."""
LINGER_S = 2.0
"""After a refusal that closes, how long what the client still sends is read and dropped."""
IDLE_TIMEOUT_S = 75.0
"""A keep-alive connection with no request in progress for this long is closed (aiohttp's default)."""
_HOST = re.compile(
    r"(?:\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\.[-A-Za-z0-9._~!$&'()*+,;=:]+)\]"  # IP-literal (RFC 3986 3.2.2)
    r"|(?:[-A-Za-z0-9._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)"  # reg-name, IPv4address among them
    r"(?::[0-9]*)?"  # port
)
"""A Host value (RFC 9110 7.2, RFC 3986 3.2.2): no spaces, userinfo (``@``), second port or control bytes."""
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """What the server holds at most; past each, the client is refused (docs/proxy.md, "The API port's
    server")."""

    max_body_bytes: int  # one request's body: 413
    body_budget_bytes: int  # request bodies held across all connections, each until answered: 503
    max_connections: int  # client connections open at once: the next one gets 503
    head_timeout_s: float  # a request's first byte (a new connection's accept) to its complete head: 408


class HttpRequest:
    """One request as read (a plain class with slots, not a dataclass: ``legs.ClientRequest`` says why)."""

    __slots__ = ("body", "headers", "http10", "keep_alive", "method", "path")

    def __init__(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytearray,
        keep_alive: bool = True,
        http10: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers  # names lowercased; repeated headers joined with ", "
        self.body = body  # one buffer, grown as the body arrives: a big one is its own mmap'd block, freed whole
        self.keep_alive = keep_alive  # the connection may carry another request after this one
        self.http10 = http10


Handler = Callable[[HttpRequest, "ResponseSink"], Awaitable[None]]
HeadCheck = Callable[[str, str, Mapping[str, str]], ApiError | None]
"""Called with a request's method, path and headers once its head is complete, before any of its body is
read: an ApiError refuses it (answered, then the connection closes; the body is never buffered)."""


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
        if not self.send(data):
            await self._conn.drain()

    def send(self, data: bytes) -> bool:
        """Write ``data`` now (raises ClientGone); False once the client's socket buffer is full: ``drain``
        before sending more."""
        if data:
            head, self._head = self._head, b""
            if self._conn.http10:
                self._conn.send(head + data)
            else:
                self._conn.send(b"%s%x\r\n%s\r\n" % (head, len(data), data))
        return not self._conn.write_paused

    async def drain(self) -> None:
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


@dataclass
class _Refusal:
    """An answer the connection gives itself, in its turn among the pipelined requests."""

    error: ApiError
    close: bool = True  # the connection ends after it (not after a Content-Length body dropped whole)


class _Message:
    """The request being parsed: its head so far, then its body."""

    def __init__(self) -> None:
        self.target = b""
        self.path = ""
        self.headers: dict[str, str] = {}
        self.hosts = 0
        self.in_body = False  # the head is complete
        self.chunked = False
        self.close_after = False  # Transfer-Encoding in HTTP/1.0: served, then the connection closes
        self.drop_body = False  # refused at its head (413): the body is read and dropped
        self.body = bytearray()
        self.length = 0  # Content-Length
        self.received = 0  # decoded body bytes, a dropped body's included
        self.size = 0  # decoded body bytes kept
        self.spans = 0  # head bytes the parser reported (request target, names and values)
        self.head_fed = 0  # head bytes counted per slice fed (see _ApiConnection._account)
        self.raw = 0  # bytes fed of a chunked body, framing included
        self.gap = 0  # bytes fed in a row of a chunked body without a body byte
        self.wants_continue = False


class _ApiConnection(asyncio.Protocol):
    """One client connection: parse requests into a queue, serve them one at a time, in order.

    Also the callback object of its llhttp parser (``on_*``). A callback refuses a request by raising
    ApiError: llhttp stops, and the refusal is answered in its turn, then the connection closes.
    """

    def __init__(self, server: ApiServer) -> None:
        self._loop = asyncio.get_running_loop()  # kept: each lookup is a getpid system call in CPython 3.11
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[HttpRequest | _Refusal] = deque()
        self._queued_bytes = 0
        self._held = 0  # body bytes of this connection counted in the server's budget
        self._message: _Message | None = None
        self._completed = 0  # requests parsed on this connection
        self._between = 0  # bytes read between requests (empty lines)
        self._tail = b""  # the last 3 bytes of the previous read (a blank line may straddle two)
        self._request_line = bytearray()  # the raw request line of the request being read, then its LF
        self._host = ""  # the last Host found valid here: a client sends the same one on every request
        self._line_complete = False
        self._stopped = False  # nothing more is parsed: after an error, an upgrade or Connection: close
        self._eof = False  # the client half-closed: answer what is queued, then close
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink: ResponseSink | None = None  # the answer being written
        self._probe_timer: asyncio.TimerHandle | None = None
        self._head_timer: asyncio.TimerHandle | None = None  # runs while a head is awaited (Limits.head_timeout_s)
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
        server = self._server
        if len(server.connections) >= server.limits.max_connections:
            server.refused("connection_cap")
            self._stopped = True
            error = unavailable("the proxy has as many client connections open as it may; retry", "connection_cap")
            self._answer_refusal(_Refusal(error))
            return
        server.connections.add(self)
        self._await_head()  # the first request's head is due from the accept: a silent connection is one too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._release(self._held)
        self._message = None  # its body goes now: the parser and this object refer to each other
        self._queue.clear()
        self._wake_writer()
        if self._task is not None:
            self._task.cancel()  # the client went away: the handler's legs close on the way out

    def eof_received(self) -> bool:
        """The client shut down its sending side: it still gets the answers to what it sent.

        A client that closed for good sends the same FIN, so a request still waiting for its answer is
        probed (``_probe``): a write to a closed socket fails, and that cancels the handler.
        """
        self._eof = True
        if self.closed or (self._task is None and not self._queue):
            return False  # nothing to answer: the transport closes
        self._probe()
        return True  # keep the transport open for writing

    def _probe(self) -> None:
        """A 100 (Continue) every EOF_PROBE_S until the answer starts (HTTP/1.1: clients parse any 1xx)."""
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        sink = self._sink
        if self.closed or self._transport is None or sink is None or sink.started or self.http10:
            return
        self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._probe_timer = self._loop.call_later(EOF_PROBE_S, self._probe)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        """Feed the parser in slices, so that the limits below are counted to within one slice, and so that
        every request starts a slice (``_slice_end``): its request line is read from there."""
        if self._stopped:
            return
        view, pos = memoryview(data), 0
        while pos < len(data) and not self._stopped:
            end = self._slice_end(data, pos)
            if not self._line_complete:
                self._collect_request_line(data, pos, end)
            self._feed(view[pos:end])
            pos = end
        if self._message is not None and not self._message.in_body:
            self._await_head()  # a head not complete in this read: due from its first byte, read just now
        self._tail = (self._tail + data[-3:])[-3:]
        self._serve_next()
        far_ahead = len(self._queue) > MAX_QUEUED_REQUESTS or self._queued_bytes > self._server.limits.max_body_bytes
        if far_ahead and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()  # a client pipelining far ahead waits for its answers

    def _slice_end(self, data: bytes, pos: int) -> int:
        """Where the slice of ``data`` from ``pos`` ends: at a ``Content-Length`` body's end, else after the
        first blank line (CRLF CRLF, one begun in the previous read too) or FEED_SLICE_BYTES on. Every
        request ends at one of these (a head without a body and a chunked body end in a blank line), so
        the next one starts a slice."""
        message = self._message
        if message is not None and message.in_body and not message.chunked:
            return min(len(data), pos + max(message.length - message.received, 1))
        if pos == 0 and (straddle := (self._tail + data[:3]).find(b"\r\n\r\n")) >= 0:
            return straddle + 4 - len(self._tail)
        stop = min(len(data), pos + FEED_SLICE_BYTES)
        blank = data.find(b"\r\n\r\n", max(pos - 3, 0), stop)  # not the one that ended at pos
        return stop if blank < 0 else blank + 4

    def _collect_request_line(self, data: bytes, pos: int, end: int) -> None:
        """The raw request line of the request being read, up to its LF (empty lines before it skipped,
        RFC 9112 2.2): llhttp reads past repeated spaces in it, which RFC 9112 3 does not allow."""
        line = self._request_line
        while pos < end and len(line) <= MAX_HEAD_BYTES:  # past it the head limit refuses the request
            lf = data.find(b"\n", pos, end)
            stop = end if lf < 0 else lf + 1
            line += data[pos:stop]
            pos = stop
            if lf < 0:
                return
            if not line.rstrip(b"\r\n"):  # an empty line
                line.clear()
                continue
            self._line_complete = True
            return

    def _feed(self, data: bytes | memoryview) -> None:
        if self._stopped:
            return
        before, completed = self._message, self._completed
        was_in_body, size = (False, 0) if before is None else (before.in_body, before.size)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # served as a plain request (no route upgrades), then closed
            self._stopped = True
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, ApiError):  # its traceback would keep the refused body alive (the parser keeps it)
                self._refuse(cause.with_traceback(None))
            else:
                log.error("HTTP parser callback failed: %r", cause, exc_info=cause)
                self._refuse(_internal_error())
        except httptools.HttpParserError as exc:
            if not self._stopped:  # after Connection: close llhttp refuses more bytes: they are ignored
                self._refuse(ApiError(400, f"malformed HTTP/1.1 request: {exc}", code="bad_request"))
        else:
            self._account(len(data), before, was_in_body, size, self._completed > completed)

    def _account(self, fed: int, before: _Message | None, was_in_body: bool, size_before: int, ended: bool) -> None:
        """The limits the parser's callbacks cannot see, counted per slice fed.

        A slice spent wholly inside a head (or a chunked body) counts whole; in a slice where a head
        begins after another request ended, only what the parser reported of it counts. So each limit
        holds to within one slice, and nothing is buffered past them: llhttp keeps no more than the field
        it is in, and a body is bounded by the body limit and the server's budget.
        """
        message = self._message
        if message is None:
            self._between = self._between + fed if before is None and not ended else 0
            if self._between > MAX_HEAD_BYTES:  # empty lines between requests
                self._refuse(_head_too_large())
            return
        self._between = 0
        same = message is before
        if not message.in_body:
            if same:
                message.head_fed += fed
            else:
                message.head_fed = message.spans if ended else fed
            if message.head_fed > MAX_HEAD_BYTES:
                self._refuse(_head_too_large())
        elif message.chunked:
            whole = same and was_in_body
            message.raw = message.raw + fed if whole else message.size
            message.gap = message.gap + fed if whole and message.size == size_before else 0
            if message.gap > MAX_CHUNK_GAP_BYTES:
                self._refuse(ApiError(400, "chunk extension or trailer section too long", code="bad_request"))
            elif message.raw - message.size > MAX_FRAMING_PER_BODY_BYTE * message.size + MAX_CHUNK_GAP_BYTES:
                self._refuse(ApiError(400, "chunked framing far larger than the body", code="bad_request"))

    # -- parser callbacks (llhttp, through httptools) ------------------------------------------

    def on_message_begin(self) -> None:
        self._message = _Message()  # its head's timer is armed only if the head is not complete in this read

    def on_url(self, url: bytes) -> None:
        message = self._current()
        message.target += url
        message.spans += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._current()
        if message.in_body:  # a trailer field (bounded by MAX_CHUNK_GAP_BYTES): ignored
            return
        message.spans += len(name) + len(value) + 4
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        if key == "host":
            message.hosts += 1
        headers = message.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        message = self._current()
        message.in_body = True
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        version = self._parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise ApiError(505, f"HTTP/{version} is not supported", code="bad_request")
        if message.hosts > 1 or (message.hosts == 0 and version == "1.1"):  # RFC 9112 3.2
            raise ApiError(400, "an HTTP/1.1 request needs exactly one Host header", code="bad_request")
        headers = message.headers
        if message.hosts and headers["host"] != self._host:  # a regex match was 1.3 % of a request's instructions
            if not _HOST.fullmatch(headers["host"]):  # RFC 9110 7.2: uri-host [ ":" port ]
                raise ApiError(400, f"invalid Host {headers['host']!r}", code="bad_request")
            self._host = headers["host"]
        expected = b"%s %s HTTP/%s\r\n" % (self._parser.get_method(), message.target, version.encode())
        if self._request_line != expected:  # RFC 9112 3: method SP request-target SP HTTP-version CRLF
            raise ApiError(400, "malformed request line", code="bad_request")
        codings = headers.get("transfer-encoding")
        if codings is not None:  # llhttp refused chunked twice and framing it cannot read; we decode chunked
            if codings.rsplit(",", 1)[-1].strip().lower() != "chunked":  # RFC 9112 6.3: no length
                raise ApiError(400, f"Transfer-Encoding {codings!r} does not end in chunked", code="bad_request")
            if codings.strip().lower() != "chunked":  # gzip, chunked: a coding we do not decode (RFC 9112 6.1)
                raise ApiError(501, f"Transfer-Encoding {codings!r} is not supported", code="not_implemented")
            message.close_after = version == "1.0"  # RFC 9112 6.1: the framing may be faulty, close after
            message.chunked = True
        try:
            message.path = (httptools.parse_url(message.target).path or b"").decode("latin-1")
        except httptools.HttpParserInvalidURLError as exc:
            raise ApiError(400, "malformed request target", code="bad_request") from exc
        check = self._server.check_head
        if check is not None and (refusal := check(self._parser.get_method().decode("latin-1"), message.path, headers)):
            raise refusal
        message.wants_continue = headers.get("expect", "").lower() == "100-continue"
        message.length = length = int(headers.get("content-length", "0"))  # llhttp admits 1*DIGIT only
        limit = self._server.limits.max_body_bytes
        if length > limit:  # answered now; the body is dropped as it comes unless the client waits for 100
            message.drop_body = True
            self._stopped = message.wants_continue
            self._queue.append(_Refusal(_body_too_large(limit), close=message.wants_continue))

    def on_body(self, body: bytes) -> None:
        message = self._current()
        message.received += len(body)
        if message.drop_body:
            return
        message.size += len(body)
        server = self._server
        if message.size > server.limits.max_body_bytes:
            raise _body_too_large(server.limits.max_body_bytes)
        if server.held_bytes + len(body) > server.limits.body_budget_bytes:
            server.refused("body_budget")
            raise unavailable("the proxy holds as many request bytes as it may; retry", "body_budget")
        message.body += body
        self._held += len(body)
        server.held_bytes += len(body)

    def on_message_complete(self) -> None:
        message = self._current()
        self._message = None
        self._completed += 1
        self._request_line.clear()
        self._line_complete = False
        parser = self._parser
        keep_alive = parser.should_keep_alive() and not parser.should_upgrade() and not message.close_after
        if not keep_alive:
            self._stopped = True
        if message.drop_body:
            return
        body = message.body
        request = HttpRequest(
            parser.get_method().decode("latin-1"),
            message.path,
            message.headers,
            body,
            keep_alive,
            parser.get_http_version() == "1.0",
        )
        self._queued_bytes += len(body)
        self._queue.append(request)

    def _current(self) -> _Message:
        assert self._message is not None  # llhttp calls on_message_begin first
        return self._message

    # -- requests ------------------------------------------------------------------------------

    def _refuse(self, error: ApiError) -> None:
        """Answer ``error`` once the requests before it are answered, then close; read nothing more."""
        self._stopped = True
        self._queue.append(_Refusal(error))
        if self._message is not None:  # its body so far is dropped
            self._release(len(self._message.body))
            self._message = None

    def _release(self, size: int) -> None:
        """Body bytes no longer held: a request answered, a body dropped, the connection gone (which
        releases everything; what its requests release later is then already counted)."""
        size = min(size, self._held)
        self._held -= size
        self._server.held_bytes -= size

    def _serve_next(self) -> None:
        """Answer what is queued, in order: refusals at once, a request by starting its handler."""
        while self._task is None and not self.closed:
            if not self._queue:
                if self._eof or self._stopped:
                    self.close()
                else:
                    self._continue()
                return
            item = self._queue.popleft()
            if isinstance(item, _Refusal):
                if not self._answer_refusal(item):
                    return
                continue
            self._queued_bytes -= len(item.body)
            self.keep_alive, self.http10 = item.keep_alive, item.http10
            self._task = self._loop.create_task(self._serve(item))

    def _answer_refusal(self, refusal: _Refusal) -> bool:
        """Answer ``refusal`` (then close, unless it leaves the connection usable); False: the client is gone."""
        self.keep_alive, self.http10 = not refusal.close, False
        err = refusal.error
        try:
            ResponseSink(self, head_only=False).answer(err.status, err.headers(), err.json_bytes())
        except ClientGone:
            return False
        if refusal.close:
            self._linger()
        return True

    def _await_head(self) -> None:
        if self._head_timer is None:
            limit = self._server.limits.head_timeout_s
            self._head_timer = self._loop.call_later(limit, self._head_late)

    def _head_late(self) -> None:
        """The head did not come in time (a slowloris holds its connection this way): 408, then close."""
        self._head_timer = None
        if self.closed or self._stopped:
            return
        if self._reading_paused:  # the server stopped reading (pipelined far ahead), not the client
            self._await_head()
            return
        self._server.refused("head_timeout")
        limit = self._server.limits.head_timeout_s
        self._refuse(ApiError(408, f"request head not complete within {limit:g} s", code="head_timeout"))
        self._serve_next()

    def _continue(self) -> None:
        """``Expect: 100-continue``: the client waits for this before it sends the body (once)."""
        message = self._message
        if message is not None and message.wants_continue and message.in_body and self._transport is not None:
            message.wants_continue = False
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _serve(self, request: HttpRequest) -> None:
        self._sink = sink = ResponseSink(self, head_only=request.method == "HEAD")
        if self._eof:
            self._probe()
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
        finally:
            self._release(len(request.body))
        self._task, self._sink = None, None
        self.idle_since = time.monotonic()
        if self.closed:
            return
        if not self.keep_alive or self._server.draining:
            self.close()
            return
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        self._serve_next()

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
            self._writable = self._loop.create_future()
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

    def _linger(self) -> None:
        """Close after a refusal: the answer and a FIN go out, what the client still sends is read and
        dropped for up to LINGER_S, then the connection closes. Closing at once with unread bytes
        would make the kernel reset the connection, and the client could lose the answer."""
        transport = self._transport
        if transport is None or not transport.can_write_eof():
            self.close()
            return
        self.closed = True
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._loop.call_later(LINGER_S, transport.close)


class ApiServer:
    """Routes exact paths to handlers; ``stop`` drains: no new connections, in-flight answers finish."""

    def __init__(
        self,
        routes: dict[str, dict[str, Handler]],
        limits: Limits,
        check_head: HeadCheck | None = None,
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.routes = routes
        self.limits = limits
        self.check_head = check_head
        self.refused = refused  # told the reason of each refusal past a limit, for the metrics
        self.held_bytes = 0  # request body bytes held, across connections (Limits.body_budget_bytes)
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
            return
        except ApiError as err:
            refusal = err  # answered after the except clause (docs/proxy.md, "Compiled request path")
        await sink.error(refusal)

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


def _head_too_large() -> ApiError:
    return ApiError(431, "request line and headers over 64 KiB", code="head_too_large")


def _body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes", code="body_too_large")


def _internal_error() -> ApiError:
    return ApiError(500, "internal proxy error", type="server_error", code="internal_error")
