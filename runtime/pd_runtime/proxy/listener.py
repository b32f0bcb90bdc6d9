"""The registry's inputs: the ZMQ registration socket, the TTL sweep and the /health prober.

Each frame is decoded inside try/except, so no frame can stop the listener (the toy proxy's can die of one,
docs/protocol.md#toy-proxy); malformed frames are counted and logged with back-off, then dropped. What a
frame may change is the registry's decision (gate.py), which also summarises refusals in its log; which
connections may stay is the peer table's (peers.py), applied here through libzmq's socket monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from pd_runtime.protocol import ProtocolError, Registration, parse_registration
from pd_runtime.proxy.gate import FRAMES_BURST, FRAMES_PER_S, TokenBucket
from pd_runtime.proxy.load import parse_engine_load
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.moriio_metrics import MoriioMetrics, moriio_lines, moriio_totals
from pd_runtime.proxy.peers import PeerTable, peer_bound
from pd_runtime.proxy.registry import Instance, Registry

log = logging.getLogger(__name__)

# Engines send ~200-byte frames (G1 ~300); libzmq closes a connection whose frame announces more than
# this before reading it, so no connection holds more than RECEIVE_QUEUE of them.
MAX_FRAME_BYTES = 4 * 1024
# Messages libzmq queues per connection (its default is 1000, 64 MiB of 64 KiB frames): an engine sends
# one every 3 s and the listener reads every connection once per round of at most the peer bound.
RECEIVE_QUEUE = 4
# libzmq's default is 30 s; an engine on the pod's loopback completes its ZMTP handshake in milliseconds.
HANDSHAKE_MS = 5000
# Results whose connection is shut down: it is no engine the proxy may accept.
DROPS_PEER = frozenset({"malformed", "refused_unknown", "refused_mismatch", "refused_bounds"})
ACCEPTED = frozenset({"added", "refreshed"})
# Frames remembered byte for byte: a known engine's G2 heartbeat repeats exactly and needs no decoding.
KNOWN_FRAMES_MAX = 256
_MONITOR_HEAD = struct.Struct("=Hi")  # a monitor event's first part: event id, value (here a descriptor)


def _worth_logging(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th... occurrence: visible, but a flood cannot fill the disk."""
    return count & (count - 1) == 0


class PeerWatch:
    """The registration socket's connections, as libzmq's socket monitor reports them, held to a PeerTable.

    libzmq has no call to close one connection of a ROUTER. Its monitor reports each accepted connection's
    descriptor and each disconnect, and every message carries the descriptor it came from (ZMQ_SRCFD), so
    a connection is dropped with shutdown(2) on that descriptor: libzmq sees the peer hang up and frees
    the connection itself (the descriptor stays libzmq's; it is never closed here). A descriptor that is
    not a socket of the registration port is left alone, so a number libzmq has closed and the process
    reused is never shut; at worst another registration connection is, and its DEALER reconnects.
    """

    def __init__(
        self, router: zmq.asyncio.Socket, table: PeerTable, metrics: ProxyMetrics, clock: Callable[[], float]
    ) -> None:
        self.table = table
        self.metrics = metrics
        self.clock = clock
        self.port = 0
        endpoint = f"inproc://registration-monitor-{id(self)}"
        router.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.events = router.context.socket(zmq.PAIR)
        self.events.setsockopt(zmq.RCVHWM, 0)  # unbounded: a lost disconnect would hold a place for ever
        self.events.connect(endpoint)
        self._events: zmq.Socket[bytes] = zmq.Socket.shadow(self.events.underlying)  # no future per event

    def catch_up(self) -> None:
        """Apply every event libzmq has reported, so a frame is judged with its connection known."""
        while True:
            try:
                head, _ = self._events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event, fd = _MONITOR_HEAD.unpack(head)
            if event == zmq.EVENT_ACCEPTED:
                victim = self.table.connected(fd, self.clock())
                if victim is not None:
                    self._shut(victim, "over_bound")
            else:
                self.table.gone(fd)
        self.metrics.registration_peers.set(len(self.table.peers))

    def drop(self, fd: int) -> None:
        """Shut down the connection a refused frame came from (if it is still open)."""
        if self.table.gone(fd):
            self._shut(fd, "refused_frame")

    def _shut(self, fd: int, reason: str) -> None:
        self.metrics.registration_peers_dropped.labels(reason).inc()
        try:
            conn = socket.socket(fileno=fd)
        except OSError:  # closed meanwhile, or not a socket
            return
        try:
            if conn.family in (socket.AF_INET, socket.AF_INET6) and conn.getsockname()[1] == self.port:
                conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            conn.detach()

    def close(self) -> None:
        self.events.close(linger=0)


class RegistrationListener:
    """ROUTER socket bound to --registration-address; engines' DEALERs send one msgpack frame per beat.

    Two budgets of FRAMES_PER_S: frames byte-identical to one the registry accepted (an engine's G2
    heartbeat repeats exactly: refreshed without decoding), and every other frame (decoded and judged).
    Strangers spend only the second, and the peer bound keeps the round in which libzmq hands out one
    frame per connection short, so an engine's heartbeat waits behind at most that many strangers' frames.
    Frames still queued from a connection already dropped are counted and discarded unread.
    """

    def __init__(
        self, address: str, registry: Registry, metrics: ProxyMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.address = address
        self.registry = registry
        self.metrics = metrics
        self.clock = clock
        self.on_added: Callable[[str], None] = lambda key: None  # e.g. probe the new instance at once
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._reader: zmq.Socket[bytes] = zmq.Socket.shadow(self._socket.underlying)  # no future per frame
        self._task: asyncio.Task[None] | None = None
        self._malformed = 0
        self._frames = TokenBucket(FRAMES_PER_S, FRAMES_BURST)
        self._repeats = TokenBucket(FRAMES_PER_S, FRAMES_BURST)
        self._known: dict[bytes, Registration] = {}  # accepted frames, byte for byte
        instances = len(registry.expected) if registry.expected is not None else registry.max_instances
        self.peers = PeerWatch(self._socket, PeerTable(peer_bound(instances)), metrics, clock)

    def start(self) -> None:
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        self._socket.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        self._socket.bind(self.address)
        self.peers.port = urlsplit(self._socket.getsockopt_string(zmq.LAST_ENDPOINT)).port or 0
        log.info("registration listener bound to %s (at most %d connections)", self.address, self.peers.table.bound)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.peers.close()
        self._socket.close(linger=0)
        self._context.term()

    async def _run(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self.peers.events, zmq.POLLIN)
        while True:
            self.peers.catch_up()
            try:
                message = self._reader.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                await poller.poll()
                continue
            except zmq.ZMQError as exc:  # a socket-level hiccup must not end discovery
                log.warning("registration socket error: %s", exc)
                await asyncio.sleep(0.1)
                continue
            # While frames are queued, nothing here yields: a flood would hold the event loop. This
            # yields after every frame and, past a budget, waits with the rest left queued.
            await asyncio.sleep(self.receive(message[-1].get(zmq.SRCFD), [part.bytes for part in message]))

    def receive(self, fd: int, frames: list[bytes]) -> float:
        """One ROUTER message ``[identity, payload]`` from connection ``fd``; returns how long to wait."""
        if not self.peers.table.holds(fd):
            self.metrics.registration_frames.labels("from_dropped").inc()
            return 0.0
        known = self._known.get(frames[-1]) if len(frames) == 2 else None
        result, registration = (self._observe(known), known) if known is not None else self._apply(frames)
        self.metrics.registration_frames.labels(result).inc()
        if result in DROPS_PEER:
            self.peers.drop(fd)
        elif result in ACCEPTED and registration is not None:
            self.peers.table.accepted(fd, registration.http_address)
            if known is None and registration.generation == "G2":  # G1 frames carry a beat counter
                self._remember(frames[-1], registration)
        return (self._repeats if known is not None else self._frames).reserve(self.clock())

    def _remember(self, frame: bytes, registration: Registration) -> None:
        if len(self._known) >= KNOWN_FRAMES_MAX:  # engines restarted with new ports: start again, cheaply
            self._known.clear()
        self._known[frame] = registration

    def _apply(self, frames: list[bytes]) -> tuple[str, Registration | None]:
        if len(frames) != 2:
            return self._drop(f"expected [identity, payload], got {len(frames)} frames"), None
        try:
            registration = parse_registration(frames[1])
        except ProtocolError as exc:
            return self._drop(str(exc)), None
        except Exception as exc:  # never let a frame end the listener
            return self._drop(f"undecodable frame: {type(exc).__name__}"), None
        if registration is None:
            return "hello", None
        return self._observe(registration), registration

    def _observe(self, registration: Registration) -> str:
        observation = self.registry.observe(registration, self.clock())
        if observation.outcome == "added":
            self.on_added(registration.http_address)
            log.info(
                "instance registered role=%s http=%s zmq=%s dp=%d tp=%d mode=%s generation=%s",
                registration.role,
                registration.http_address,
                registration.zmq_address,
                registration.dp_size,
                registration.tp_size,
                registration.transfer_mode,
                registration.generation,
            )
        return observation.outcome

    def _drop(self, reason: str) -> str:
        self._malformed += 1
        if _worth_logging(self._malformed):
            log.warning("dropped malformed registration frame (%d so far): %s", self._malformed, reason)
        return "malformed"


def read_moriio_metrics(page: str) -> MoriioMetrics | None:
    """An engine's vLLM MoRI-IO transfer metrics (proxy/moriio_metrics.py) from its /metrics page, by
    prometheus_client's parser; None without them; ValueError for a malformed line of theirs."""
    lines = moriio_lines(page)
    return None if lines is None else moriio_totals(text_string_to_metric_families(lines))


class Housekeeping:
    """Evicts instances past their heartbeat TTL and probes every instance's GET /health."""

    def __init__(
        self,
        registry: Registry,
        metrics: ProxyMetrics,
        session: aiohttp.ClientSession,
        health_interval_s: float,
        health_timeout_s: float,
        engine_api_key: str | None,
        load_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.load_interval_s = load_interval_s
        self.metrics = metrics
        self.session = session
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.headers = {"Authorization": f"Bearer {engine_api_key}"} if engine_api_key else {}
        self.clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._sweep_loop()), asyncio.create_task(self._health_loop())]
        if self.load_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._load_loop()))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._probes]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def probe_soon(self, key: str) -> None:
        """Probe one instance now (it just registered) instead of at the next interval."""
        task = asyncio.create_task(self._probe_one(key))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe_one(self, key: str) -> None:
        inst = self.registry.instances.get(key)
        if inst is not None:
            ok = await self._probe(inst)
            self._record(inst, ok)
            if ok and inst.vllm_version is None:
                await self._read_version(inst)

    def sweep_interval(self) -> float:
        """A quarter of the shortest TTL (at most 1 s), so an eviction lands well within the TTL."""
        ttls = [self.registry.ttl(inst) for inst in self.registry.instances.values()] or [4.0]
        return max(0.05, min(1.0, min(ttls) / 4))

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval())
            self.sweep()

    def sweep(self) -> list[Instance]:
        evicted = self.registry.sweep(self.clock())
        for inst in evicted:
            self.metrics.evictions.labels(inst.role).inc()
            signals = "heartbeat nor good /health" if self.registry.is_expected(inst) else "heartbeat"
            log.warning("instance evicted (no %s within the TTL) role=%s http=%s", signals, inst.role, inst.key)
        return evicted

    async def _health_loop(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.health_interval_s)

    async def probe_all(self) -> None:
        instances = list(self.registry.instances.values())
        results = await asyncio.gather(*(self._probe(inst) for inst in instances))
        for inst, ok in zip(instances, results, strict=True):
            self._record(inst, ok)
        unread = [inst for inst, ok in zip(instances, results, strict=True) if ok and inst.vllm_version is None]
        await asyncio.gather(*(self._read_version(inst) for inst in unread))

    def _record(self, inst: Instance, ok: bool) -> None:
        was_healthy = inst.healthy
        updated = self.registry.record_health(inst.key, ok, self.clock())
        self.metrics.health_checks.labels("ok" if ok else "failed").inc()
        if updated is not None and updated.healthy != was_healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "instance %s role=%s http=%s",
                "healthy" if ok else "unhealthy",
                inst.role,
                inst.key,
            )

    async def _load_loop(self) -> None:
        while True:
            await self.scrape_loads()
            await asyncio.sleep(self.load_interval_s)

    async def scrape_loads(self) -> None:
        """Every live engine's /metrics at once, off the request path: its load, and its vLLM MoRI-IO
        transfer metrics where it has them; a failed scrape keeps the old report, which goes stale (and
        out of routing) after a few intervals."""
        instances = self.registry.live(None, self.clock())
        pages = await asyncio.gather(*(self._scrape(inst) for inst in instances))
        for inst, page in zip(instances, pages, strict=True):
            if page is None:
                continue
            try:
                load = parse_engine_load(page)
            except ValueError as exc:  # not Prometheus text: keep the old report, let it go stale
                log.debug("unreadable /metrics from %s: %s", inst.key, exc)
                continue
            self.registry.record_load(inst.key, load, self.clock())
            try:
                moriio = read_moriio_metrics(page)
            except ValueError as exc:  # a malformed vllm:moriio_* line: keep the last reading
                log.debug("unreadable vllm:moriio_* metrics from %s: %s", inst.key, exc)
                continue
            self.registry.record_moriio(inst.key, moriio)

    async def _scrape(self, inst: Instance) -> str | None:
        try:
            async with asyncio.timeout(self.health_timeout_s):
                async with self.session.get(f"{inst.base_url}/metrics", headers=self.headers) as resp:
                    body = await resp.text()
                    return body if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
            return None

    async def _read_version(self, inst: Instance) -> None:
        """The release the engine runs, from vLLM's GET /version (``{"version": "0.31.0"}``), for /status."""
        try:
            async with asyncio.timeout(self.health_timeout_s):
                async with self.session.get(f"{inst.base_url}/version", headers=self.headers) as resp:
                    body = await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return
        version = body.get("version") if isinstance(body, dict) else None
        if isinstance(version, str) and version:
            self.registry.record_version(inst.key, version)

    async def _probe(self, inst: Instance) -> bool:
        try:
            async with asyncio.timeout(self.health_timeout_s):
                async with self.session.get(f"{inst.base_url}/health", headers=self.headers) as resp:
                    await resp.read()
                    return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False
