"""PROTOTYPE, not shipped: `pdctl proxy`'s request path behind a bare asyncio-protocol HTTP server.

It answers the question of issue 15 item 3 ("what would reach the targets"): how much of the proxy's
cost is aiohttp's server stack. Everything behind the server is the real proxy (ProxyServer with its
registry, routing, legs, upstream pool, id rewriting, errors); only the client-facing HTTP/1.1 is
replaced by a minimal parser and a chunked writer. It takes pdctl proxy's flags and runs in
benchmarks/proxy_overhead.py with ``--prototype benchmarks/prototype_raw_server.py``. It lacks what a
server must have (pipelining, Expect, chunked request bodies, header limits, /health, the admin
port's app) and is measured, never deployed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys

from pd_runtime import eventloop
from pd_runtime.proxy.cli import build_parser, config_from_args
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.errors import ApiError
from pd_runtime.proxy.legs import Endpoint, parse_client_request
from pd_runtime.proxy.logs import configure
from pd_runtime.proxy.server import ProxyServer
from pd_runtime.proxy.sinks import ClientGone

ROUTES: dict[bytes, Endpoint] = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat/completions"}


class RawSink:
    """The Sink protocol written straight to the transport, HTTP/1.1 chunked."""

    def __init__(self, conn: RawHttp) -> None:
        self.conn = conn
        self.started = False

    async def begin_stream(self, content_type: str) -> None:
        self.started = True
        self.conn.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
            % content_type.encode()
        )

    async def write(self, data: bytes) -> None:
        self.conn.send(b"%x\r\n%s\r\n" % (len(data), data))
        await self.conn.drain()

    async def end_stream(self) -> None:
        self.conn.send(b"0\r\n\r\n")

    async def whole(self, status: int, content_type: str, body: bytes) -> None:
        self.conn.send(
            b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status, content_type.encode(), len(body), body)
        )

    async def error(self, err: ApiError) -> None:
        if self.started:
            await self.write(err.sse_bytes())
            await self.end_stream()
        else:
            await self.whole(err.status, "application/json", err.json_bytes())


class RawHttp(asyncio.Protocol):
    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.writable.set()
        if self.task is not None:
            self.task.cancel()  # the client went away: the legs close on the way out

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def send(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        await self.writable.wait()
        if self.gone:
            raise ClientGone

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.task is not None:
            return
        head = self.buffer[:end].split(b"\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        path = head[0].split(b" ")[1]
        self.task = asyncio.get_running_loop().create_task(self.serve(path, body))

    async def serve(self, path: bytes, body: bytes) -> None:
        sink = RawSink(self)
        config = self.server.config
        try:
            endpoint = ROUTES.get(path)
            if endpoint is None:
                await sink.error(ApiError(404, "not found", code="not_found"))
            else:
                try:
                    request = parse_client_request(body, endpoint, config.mode, config.max_tokens_limit)
                except ApiError as err:
                    await sink.error(err)
                else:
                    await self.server.core.handle(request, sink)
        except ClientGone:
            return
        self.task = None
        if self.buffer:
            self.data_received(b"")


async def run(config: ProxyConfig) -> None:
    server = ProxyServer(dataclasses.replace(config, port=0))  # its aiohttp app idles on a free port
    await server.start()
    loop = asyncio.get_running_loop()
    raw = await loop.create_server(lambda: RawHttp(server), config.host, config.port, backlog=config.backlog)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    raw.close()
    await server.stop()


if __name__ == "__main__":
    args = build_parser().parse_args(sys.argv[1:])
    configure(args.log_level, args.log_format)
    eventloop.run(run(config_from_args(args, dict(os.environ))), args.loop)
