"""The legs' HTTP/1.1 client: pooled keep-alive connections on asyncio protocols.

Every client request costs two upstream requests, so their setup is the proxy's main per-request cost.
Profiled under load (docs/benchmarks.md, "Profile"), aiohttp's ClientSession spent more CPU per leg on
its own machinery (request and response objects, header multidicts, cookie and tracing hooks, timers)
than the proxy spent on everything else. This client does only what a leg needs: POST a body with the
given headers, read the status line and headers, then the body whole or piece by piece (Content-Length,
chunked, or until the engine closes). A connection goes back to the pool only when its response was read
to the end; one given up before (cancellation, a timeout, the client gone) is closed, which is how vLLM
learns to abort the request. Pooled connections close once idle for the pool's keep-alive time.

Responses are parsed by llhttp (httptools), the parser of the API port's server (``http1``), in its
strict mode: an engine that answers malformed HTTP (a negative chunk size, say) fails its leg cleanly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType

import httptools

PAUSE_BYTES = 256 * 1024
"""Body bytes buffered for a slow reader before the socket stops being read (backpressure)."""
MAX_HEAD_BYTES = 64 * 1024
"""An engine's status line and headers."""
MAX_GAP_BYTES = 64 * 1024
"""Bytes in a row without a body byte once the head is in (chunk extensions, trailer fields)."""


class UpstreamError(Exception):
    """The engine could not be reached, or its connection broke or spoke something that is not HTTP/1.1.

    ``answered`` is whether its status line had arrived (broken mid-answer vs unreachable).
    """

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the response being read on it (one request at a time).

    Also the callback object of its llhttp parser (``on_*``), which reads every response on it.
    """

    def __init__(self, on_lost: Callable[[_Connection], None]) -> None:
        self._on_lost = on_lost
        self.loop = asyncio.get_running_loop()  # kept: each lookup is a getpid system call in CPython 3.11
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.key = ("", 0)  # the engine's address
        self.idle_timer: asyncio.TimerHandle | None = None  # closes it when pooled and idle too long
        self.idle_since = 0.0  # loop time it was last pooled
        self.pooled = False
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self.keep_alive = True
        self._error: UpstreamError | None = None
        self._interim = False  # a 1xx answer, skipped
        self._until_close = False  # no Content-Length, not chunked: the body ends when the engine closes
        self._fed = 0  # bytes of the head, then bytes in a row without a body byte
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._received = 0  # body bytes parsed, buffered or forwarded
        self._paused = False
        self._deliver: Callable[[bytes], bool] | None = None  # ``forward``'s receiver, while it forwards
        self._halted = False  # the receiver asked to stop (its client's socket is full)

    # -- protocol callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and self._until_close and not self.complete:
            self.complete = True  # the body ran until the engine closed
        elif not self.complete and self._error is None:
            what = "closed the connection mid-answer" if self.status else "closed the connection before answering"
            self._error = UpstreamError(f"engine {what}", answered=bool(self.status))
        self._wake()
        self._on_lost(self)

    def data_received(self, data: bytes) -> None:
        if self.complete:
            self.close()  # bytes nobody asked for: this connection is out of step, never reuse it
            return
        status, received = self.status, self._received
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"engine answered malformed HTTP: {exc}")
            return
        if self.complete or (self.status and (not status or self._received != received)):
            self._fed = 0  # the head ended, or body bytes came
        else:  # a read spent in the head, or without a body byte (chunk extensions, trailer fields)
            self._fed += len(data)
            if self._fed > (MAX_GAP_BYTES if self.status else MAX_HEAD_BYTES):
                self._fail("engine's response head or chunk framing is over 64 KiB")
                return
        deliver = self._deliver
        if deliver is not None and self._pieces and not deliver(self._take()):  # one delivery per read
            self._deliver, self._halted = None, True
        if self._deliver is None or self.complete:  # while forwarding, the reader sleeps until the end
            self._wake()

    def _fail(self, message: str) -> None:
        if not self.complete:  # bytes after a complete answer only make the connection unusable
            self._error = UpstreamError(message, answered=bool(self.status))
        self.keep_alive = False
        self.close()
        self._wake()

    def pause_writing(self) -> None:  # requests are small; the kernel buffer always takes them
        pass

    def resume_writing(self) -> None:
        pass

    # -- parser callbacks (llhttp, through httptools) ------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise httptools.HttpParserError("a second answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.status:  # not a trailer field
            key, text = name.decode("latin-1").lower(), value.decode("latin-1")
            headers = self.headers
            headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the answer follows
            self._interim = True
            self.headers = {}
            return
        self.keep_alive = parser.should_keep_alive()
        framed = "content-length" in self.headers or "transfer-encoding" in self.headers
        self._until_close = not framed and status not in (204, 304)
        self.status = status

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        self._pieces.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        else:
            self.complete = True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reading (one reader, the leg's task) --------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_head(self) -> None:
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read_some(self) -> bytes:
        """The body bytes that arrived since the last call (waits for some); b"" at the end."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        return self._take()

    async def forward(self, deliver: Callable[[bytes], bool]) -> bool:
        """Hand the body to ``deliver`` as it is parsed, in the protocol's own callback: one read costs
        no task switch (a relayed stream's per-chunk cost, docs/benchmarks.md). Returns True at the end
        of the body, False as soon as ``deliver`` returns False (the caller drains its client, then
        calls again); raises what ``read_some`` raises. ``deliver`` must not raise."""
        while True:
            if self._pieces and not deliver(self._take()):
                return False
            if self._error is not None:
                raise self._error
            if self.complete:
                return True
            self._deliver, self._halted = deliver, False
            try:
                await self._wait()
            finally:
                self._deliver = None
            if self._halted:
                return False

    def _take(self) -> bytes:
        pieces = self._pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self._buffered = 0
        if self._paused and not self.closed and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read_all(self) -> bytes:
        chunks = []
        while data := await self.read_some():
            chunks.append(data)
        return b"".join(chunks)

    # -- lifecycle -----------------------------------------------------------------------------

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._pieces and self._error is None

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True


class UpstreamResponse:
    """Status, headers and body of one leg; ``async with`` returns its connection to the pool or closes it."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], conn: _Connection) -> None:
        self._pool = pool
        self._key = key
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    async def read(self) -> bytes:
        return await self._conn.read_all()

    async def read_some(self) -> bytes:
        return await self._conn.read_some()

    async def forward(self, deliver: Callable[[bytes], bool]) -> bool:
        return await self._conn.forward(deliver)

    def release(self) -> None:
        self._pool.release(self._key, self._conn)


class UpstreamRequest:
    """``async with pool.post(...) as response``: the request is sent and its head read on entry."""

    def __init__(self, pool: UpstreamPool, host: str, port: int, request: bytes) -> None:
        self._pool = pool
        self._key = (host, port)
        self._request = request
        self._response: UpstreamResponse | None = None

    async def __aenter__(self) -> UpstreamResponse:
        conn = await self._pool.connection(self._key)
        try:
            conn.send(self._request)
            await conn.wait_head()
        except BaseException:
            conn.close()
            raise
        self._response = UpstreamResponse(self._pool, self._key, conn)
        return self._response

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            self._response.release()


class UpstreamPool:
    """Keep-alive connections per engine address, most recently used first; each closes once it has
    been idle for ``keepalive_s`` (a timer per pooled connection), not only when next taken.

    A connection's timer is not cancelled when it is taken: it checks the idle time when it fires and
    arms again for the end of it, so a connection reused within ``keepalive_s`` arms no timer per request.
    """

    def __init__(self, connect_timeout: float, keepalive_s: float) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._open: set[_Connection] = set()

    def post(self, host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> UpstreamRequest:
        head = [f"POST {path} HTTP/1.1\r\nHost: {_host_header(host, port)}\r\nContent-Length: {len(body)}\r\n"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name} holds a line break")
            head.append(f"{name}: {value}\r\n")
        head.append("\r\n")
        return UpstreamRequest(self, host, port, "".join(head).encode("latin-1") + body)

    async def connection(self, key: tuple[str, int]) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            conn.pooled = False
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self._lost), key[0], key[1])
        except TimeoutError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} timed out", answered=False) from exc
        except OSError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} failed: {exc}", answered=False) from exc
        conn.key = key
        self._open.add(conn)
        return conn

    def release(self, key: tuple[str, int], conn: _Connection) -> None:
        if not conn.reusable:
            conn.close()
            return
        self._idle.setdefault(key, deque()).append(conn)
        conn.pooled, conn.idle_since = True, conn.loop.time()
        if conn.idle_timer is None:
            conn.idle_timer = conn.loop.call_at(conn.idle_since + self.keepalive_s, self._expire, conn)

    def _expire(self, conn: _Connection) -> None:
        """Idle for the keep-alive time: closed before the engine's own keep-alive drops it. Taken since
        the timer was armed: nothing (its next release arms one), or arm again for its idle time's end."""
        conn.idle_timer = None
        if not conn.pooled:
            return
        due = conn.idle_since + self.keepalive_s
        if conn.loop.time() < due:
            conn.idle_timer = conn.loop.call_at(due, self._expire, conn)
            return
        self._forget(conn)
        conn.close()

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)
        _stop_timer(conn)
        if conn.pooled:  # an idle connection the engine closed
            conn.pooled = False
            self._forget(conn)

    def close(self) -> None:
        for conn in list(self._open):
            _stop_timer(conn)
            conn.close()
        self._idle.clear()


def _stop_timer(conn: _Connection) -> None:
    if conn.idle_timer is not None:
        conn.idle_timer.cancel()
        conn.idle_timer = None


def _host_header(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
