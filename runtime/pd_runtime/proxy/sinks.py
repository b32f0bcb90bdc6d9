"""Where a relayed answer goes: the client's HTTP response, or a buffer (the canary)."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

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

    async def end_stream(self) -> None: ...

    async def whole(self, status: int, content_type: str, body: bytes) -> None: ...

    async def error(self, err: ApiError) -> None: ...


class ClientSink:
    """Streams to an aiohttp response, prepared only when the first bytes are ready, so a failure
    before that is still a proper HTTP status with a JSON body."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None and self.response.prepared

    async def begin_stream(self, content_type: str) -> None:
        response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        self.response = response
        try:
            await response.prepare(self._request)
        except ConnectionResetError as exc:
            raise ClientGone from exc

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionResetError as exc:
            raise ClientGone from exc

    async def end_stream(self) -> None:
        assert self.response is not None
        try:
            await self.response.write_eof()
        except ConnectionResetError as exc:
            raise ClientGone from exc

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        self.response = web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async def error(self, err: ApiError) -> None:
        if self.started:
            await self.write(err.sse_bytes())
            await self.end_stream()
        else:
            self.response = web.Response(status=err.status, body=err.json_bytes(), headers=err.headers())


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
        self.body += data

    async def end_stream(self) -> None:
        return None

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.body = status, body

    async def error(self, err: ApiError) -> None:
        self.status, self.body = err.status, err.json_bytes()
