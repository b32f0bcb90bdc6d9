"""The registry's inputs: the ZMQ registration socket, the TTL sweep and the /health prober.

Each frame is decoded inside try/except, so no frame can stop the listener (the toy proxy's can die of one,
docs/protocol.md#toy-proxy); malformed frames are counted and logged with back-off, then dropped. What a
frame may change is the registry's decision (gate.py), which also summarises refusals in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp
import zmq
import zmq.asyncio

from pd_runtime.protocol import ProtocolError, parse_registration
from pd_runtime.proxy.gate import FRAMES_BURST, FRAMES_PER_S, TokenBucket
from pd_runtime.proxy.load import parse_engine_load
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Instance, Registry

log = logging.getLogger(__name__)

# Engines send ~200-byte frames; anything far larger is not a registration (ZMQ drops the peer).
MAX_FRAME_BYTES = 64 * 1024


def _worth_logging(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th... occurrence: visible, but a flood cannot fill the disk."""
    return count & (count - 1) == 0


class RegistrationListener:
    """ROUTER socket bound to --registration-address; engines' DEALERs send one msgpack frame per beat."""

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
        self._task: asyncio.Task[None] | None = None
        self._malformed = 0
        self._frames = TokenBucket(FRAMES_PER_S, FRAMES_BURST)

    def start(self) -> None:
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._socket.bind(self.address)
        log.info("registration listener bound to %s", self.address)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._socket.close(linger=0)
        self._context.term()

    async def _run(self) -> None:
        while True:
            try:
                frames = await self._socket.recv_multipart()
            except zmq.ZMQError as exc:  # a socket-level hiccup must not end discovery
                log.warning("registration socket error: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self.handle(frames)
            # While frames are queued, recv returns without yielding: a flood would hold the event loop.
            # This yields after every frame and, past the frame budget, waits with the rest left queued.
            await asyncio.sleep(self._frames.reserve(self.clock()))

    def handle(self, frames: list[bytes]) -> str:
        """Apply one ROUTER message ``[identity, payload]``; returns the result label."""
        result = self._apply(frames)
        self.metrics.registration_frames.labels(result).inc()
        return result

    def _apply(self, frames: list[bytes]) -> str:
        if len(frames) != 2:
            return self._drop(f"expected [identity, payload], got {len(frames)} frames")
        try:
            registration = parse_registration(frames[1])
        except ProtocolError as exc:
            return self._drop(str(exc))
        except Exception as exc:  # never let a frame end the listener
            return self._drop(f"undecodable frame: {type(exc).__name__}")
        if registration is None:
            return "hello"
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
            self._record(inst, await self._probe(inst))

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
        """Every live engine's /metrics at once, off the request path; a failed scrape keeps the old
        report, which goes stale (and out of routing) after a few intervals."""
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

    async def _scrape(self, inst: Instance) -> str | None:
        try:
            async with asyncio.timeout(self.health_timeout_s):
                async with self.session.get(f"{inst.base_url}/metrics", headers=self.headers) as resp:
                    body = await resp.text()
                    return body if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
            return None

    async def _probe(self, inst: Instance) -> bool:
        try:
            async with asyncio.timeout(self.health_timeout_s):
                async with self.session.get(f"{inst.base_url}/health", headers=self.headers) as resp:
                    await resp.read()
                    return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False
