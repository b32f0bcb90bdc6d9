"""The legs' HTTP/1.1 client: pooled keep-alive connections on asyncio protocols.

Every client request costs two upstream requests, so their setup is the proxy's main per-request cost.
Profiled under load (docs/benchmarks.md, "Profile"), aiohttp's ClientSession spent more CPU per leg on
its own machinery (request and response objects, header multidicts, cookie and tracing hooks, timers)
than the proxy spent on everything else. This client does only what a leg needs: POST a body with the
given headers, read the status line and headers, then the body whole or piece by piece (Content-Length,
chunked, or until the engine closes). A connection goes back to the pool only when its response was read
to the end; one given up before (cancellation, a timeout, the client gone) is closed, which is how vLLM
learns to abort the request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from pd_runtime.proxy.chunked import ChunkedDecoder

PAUSE_BYTES = 256 * 1024
"""Body bytes buffered for a slow reader before the socket stops being read (backpressure)."""


class UpstreamError(Exception):
    """The engine could not be reached, or its connection broke or spoke something that is not HTTP/1.1.

    ``answered`` is whether its status line had arrived (broken mid-answer vs unreachable).
    """

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


Framing = Literal["length", "chunked", "close"]


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the response being read on it (one request at a time)."""

    def __init__(self, on_lost: Callable[[_Connection], None]) -> None:
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self.keep_alive = True
        self._error: UpstreamError | None = None
        self._head = b""
        self._framing: Framing = "close"
        self._left = 0  # bytes left of the body (length framing)
        self._chunked = ChunkedDecoder()
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._paused = False

    # -- protocol callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and self._framing == "close" and not self.complete:
            self.complete = True  # the body ran until the engine closed
        elif not self.complete:
            what = "closed the connection mid-answer" if self.status else "closed the connection before answering"
            self._error = UpstreamError(f"engine {what}", answered=bool(self.status))
        self._wake()
        self._on_lost(self)

    def data_received(self, data: bytes) -> None:
        if self.complete:
            self.close()  # bytes nobody asked for: this connection is out of step, never reuse it
            return
        try:
            if not self.status:
                data = self._parse_head(data)
                if not self.status:
                    return
            if self._framing == "chunked":
                self._push(self._chunked.feed(data))
                self.complete = self._chunked.done
            elif self._framing == "length":
                take = data[: self._left] if len(data) > self._left else data
                self._left -= len(take)
                self._push(take)
                self.complete = self._left == 0
            else:
                self._push(data)
        except (ValueError, IndexError) as exc:
            self._error = UpstreamError(f"engine answered malformed HTTP: {exc}", answered=bool(self.status))
            self.keep_alive = False
            assert self.transport is not None
            self.transport.close()
        self._wake()

    def pause_writing(self) -> None:  # requests are small; the kernel buffer always takes them
        pass

    def resume_writing(self) -> None:
        pass

    # -- parsing -------------------------------------------------------------------------------

    def _parse_head(self, data: bytes) -> bytes:
        """Consume the status line and headers; returns the body bytes that followed them."""
        head = self._head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > 64 * 1024:
                raise ValueError("response head over 64 KiB")
            self._head = head
            return b""
        lines = head[:end].decode("latin-1").split("\r\n")
        version, code = lines[0].split(" ", 2)[:2]
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in headers:
            self._framing, self._left = "length", int(headers["content-length"])
        else:
            self._framing, self.keep_alive = "close", False
        status = int(code)
        self.complete = self._framing == "length" and self._left == 0
        self.status = status
        self._head = b""
        return head[end + 4 :]

    def _push(self, piece: bytes) -> None:
        if not piece:
            return
        self._pieces.append(piece)
        self._buffered += len(piece)
        if self._buffered > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reading (one reader, the leg's task) --------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
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
    """Keep-alive connections per engine address, most recently used first."""

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
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self._lost), key[0], key[1])
        except TimeoutError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} timed out", answered=False) from exc
        except OSError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} failed: {exc}", answered=False) from exc
        self._open.add(conn)
        return conn

    def release(self, key: tuple[str, int], conn: _Connection) -> None:
        if not conn.reusable:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(key, deque())
        while idle and conn.idle_since - idle[0].idle_since >= self.keepalive_s:
            idle.popleft().close()  # the oldest, past keep-alive: the engine may be closing it
        idle.append(conn)

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)

    def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._idle.clear()


def _host_header(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
