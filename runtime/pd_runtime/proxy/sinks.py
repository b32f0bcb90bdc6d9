"""Where a relayed answer goes: the client's HTTP response (http1.ResponseSink), or a buffer (the canary)."""

from __future__ import annotations

from typing import Protocol

from pd_runtime.proxy.errors import ApiError


class ClientGone(Exception):
    """The client closed its connection while the answer was being written."""


class Sink(Protocol):
    @property
    def started(self) -> bool:
        """Whether stream bytes have gone out (from then on errors must be stream events)."""
        ...

    async def begin_stream(self, content_type: str) -> None: ...

    async def write(self, data: bytes) -> None: ...

    def send(self, data: bytes) -> bool:
        """``write`` without waiting: False when the reader is behind and ``drain`` is due."""
        ...

    async def drain(self) -> None: ...

    async def end_stream(self) -> None: ...

    async def whole(self, status: int, content_type: str, body: bytes) -> None: ...

    async def error(self, err: ApiError) -> None: ...


class ContinuedSink:
    """A sink whose stream has begun: a migrated request's continuation writes on without a second head."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    @property
    def started(self) -> bool:
        return True

    async def begin_stream(self, content_type: str) -> None:
        return None

    async def write(self, data: bytes) -> None:
        await self._sink.write(data)

    def send(self, data: bytes) -> bool:
        return self._sink.send(data)

    async def drain(self) -> None:
        await self._sink.drain()

    async def end_stream(self) -> None:
        await self._sink.end_stream()

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        await self._sink.whole(status, content_type, body)

    async def error(self, err: ApiError) -> None:
        await self._sink.error(err)


class BufferSink:
    """Collects an answer in memory (the canary's non-streaming request)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def begin_stream(self, content_type: str) -> None:
        self._started = True
        self.status = 200

    async def write(self, data: bytes) -> None:
        self.send(data)

    def send(self, data: bytes) -> bool:
        self.body += data
        return True

    async def drain(self) -> None:
        return None

    async def end_stream(self) -> None:
        return None

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.body = status, body

    async def error(self, err: ApiError) -> None:
        self.status, self.body = err.status, err.json_bytes()
