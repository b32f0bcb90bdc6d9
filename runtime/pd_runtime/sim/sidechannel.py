"""The engine-to-engine ZMQ side channels of MoRI-IO (docs/protocol.md#side-channels).

Each engine binds a ROUTER for the handshake and one for notifies at ``base + dp_rank + tp_rank`` for
every rank offset it simulates (docs/protocol.md#rank-ports), and dials its peers with cached DEALERs. The
handshake answers ``get_meta_msg`` with the two messages a real worker sends (agent metadata, then per-layer
memory descriptors); the payload is synthetic but has vLLM's keys and types. Unlike vLLM, a bad
frame is logged and dropped instead of killing the listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from pd_runtime import protocol
from pd_runtime.sim.metrics import EngineMetrics

log = logging.getLogger(__name__)

NotifyHandler = Callable[[dict[str, Any] | str], None]


class HandshakeError(RuntimeError):
    """The peer did not answer get_meta_msg with the two expected messages in time."""


def metadata_messages(engine_id: str, num_blocks: int, block_len: int, layers: int) -> tuple[bytes, bytes]:
    """The two handshake replies (docs/protocol.md#handshake): MoRIIOAgentMetadata, then {layer: [descriptors]}."""
    agent = {
        "engine_id": engine_id,
        "agent_metadata": b"sim-engine-desc:" + engine_id.encode(),
        "kv_caches_base_addr": [0x7F0000000000 + i * 0x100000000 for i in range(layers)],
        "num_blocks": num_blocks,
        "block_len": block_len,
        "attn_backend_name": "SIM_ATTN",
    }
    descriptors = {f"model.layers.{i}.self_attn.attn": [f"sim-mem-{i}".encode()] for i in range(layers)}
    return msgpack.packb(agent, use_bin_type=True), msgpack.packb(descriptors, use_bin_type=True)


class SideChannel:
    def __init__(
        self,
        bind_host: str,
        handshake_base: int,
        notify_base: int,
        offsets: Iterable[int],
        engine_id: str,
        metrics: EngineMetrics,
        on_notify: NotifyHandler,
        drop_fraction: float = 0.0,
        handshake_timeout_s: float = 30.0,
    ) -> None:
        self._bind_host = bind_host
        self._handshake_ports = [handshake_base + o for o in offsets]
        self._notify_ports = [notify_base + o for o in offsets]
        self._metadata = metadata_messages(engine_id, num_blocks=65536, block_len=16 * 1024, layers=4)
        self._metrics = metrics
        self._on_notify = on_notify
        self._drop_fraction = drop_fraction
        self._handshake_timeout_s = handshake_timeout_s
        self._rng = random.Random(engine_id)
        self._ctx = zmq.asyncio.Context()
        self._tasks: list[asyncio.Task[None]] = []
        self._dealers: dict[tuple[str, int], zmq.asyncio.Socket] = {}
        self._shaken: dict[tuple[str, int], asyncio.Task[None]] = {}

    def start(self) -> None:
        """Bind every listener now (a taken port fails here, loudly), then serve them in tasks."""
        for ports, handle in (
            (self._handshake_ports, self._answer_handshake),
            (self._notify_ports, self._receive_notify),
        ):
            for port in ports:
                self._tasks.append(asyncio.create_task(self._serve(port, self._router(port), handle)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self._dealers.values():
            sock.close(linger=0)
        self._ctx.destroy(linger=0)

    def _router(self, port: int) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://{self._bind_host}:{port}")
        return sock

    async def _serve(
        self, port: int, sock: zmq.asyncio.Socket, handle: Callable[[zmq.asyncio.Socket, list[bytes]], Any]
    ) -> None:
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    await handle(sock, frames)
                except Exception:
                    log.exception("side channel :%d dropped a bad message", port)
        finally:
            sock.close(linger=0)

    async def _answer_handshake(self, sock: zmq.asyncio.Socket, frames: list[bytes]) -> None:
        identity, body = frames[0], frames[1:]
        if body and body[0] == protocol.GET_META_MSG:
            self._metrics.handshakes.labels("inbound").inc()
            for payload in self._metadata:
                await sock.send_multipart([identity, b"", payload])
        elif body and body[0] == protocol.POP_DONE_RECV:
            log.info("handshake listener: legacy pop_done_recv ignored")
        else:
            log.warning("handshake listener: unexpected frame %r dropped", body[:1])

    async def _receive_notify(self, sock: zmq.asyncio.Socket, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("notify listener: expected one frame after the identity, got %d", len(frames) - 1)
            return
        try:
            message = protocol.parse_notify(frames[1])
        except protocol.ProtocolError as exc:
            log.warning("notify listener: %s", exc)
            return
        kind = message["type"] if isinstance(message, dict) else "raw"
        if self._drop_fraction and self._rng.random() < self._drop_fraction:
            self._metrics.notify.labels("dropped", kind).inc()
            log.info("fault knob: dropped a %s notify", kind)
            return
        self._metrics.notify.labels("received", kind).inc()
        self._on_notify(message)

    def _dealer(self, host: str, port: int) -> zmq.asyncio.Socket:
        key = (host, port)
        sock = self._dealers.get(key)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{_bracket(host)}:{port}")
            self._dealers[key] = sock
        return sock

    async def notify(self, host: str, ports: Iterable[int], frame: bytes, kind: str) -> None:
        """Send one notify frame to each of the peer's rank ports."""
        for port in ports:
            await self._dealer(host, port).send(frame)
            self._metrics.notify.labels("sent", kind).inc()

    async def handshake(self, host: str, ports: Iterable[int]) -> None:
        """First contact with a peer's ranks: get_meta_msg, two replies. Cached per rank port."""
        waits = []
        for port in ports:
            key = (host, port)
            task = self._shaken.get(key)
            if task is None or (task.done() and task.exception() is not None):
                task = asyncio.create_task(self._shake(host, port))
                self._shaken[key] = task
            waits.append(task)
        await asyncio.gather(*waits)

    async def _shake(self, host: str, port: int) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{_bracket(host)}:{port}")
        try:
            await sock.send(protocol.GET_META_MSG)
            replies = [await asyncio.wait_for(sock.recv_multipart(), self._handshake_timeout_s) for _ in range(2)]
        except TimeoutError:
            raise HandshakeError(f"no handshake answer from {host}:{port}") from None
        finally:
            sock.close(linger=0)
        agent = msgpack.unpackb(replies[0][-1], raw=False)
        if not isinstance(agent, dict) or "engine_id" not in agent:
            raise HandshakeError(f"{host}:{port} answered get_meta_msg without agent metadata")
        self._metrics.handshakes.labels("outbound").inc()
        log.info("handshake with %s:%d done (peer engine %s)", host, port, agent["engine_id"])


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def bind_host_for(advertised: str) -> str:
    """Loopback-advertised engines bind loopback only; others bind every interface, as vLLM does."""
    return "127.0.0.1" if advertised.startswith("127.") or advertised == "localhost" else "*"
