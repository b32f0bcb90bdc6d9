from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from pd_runtime.proxy.server import ProxyServer
from tests.proxy.proxy_fakes import FakeEngine, Registrar, proxy_config, start_proxy, wait_for


@dataclass
class PdSetup:
    """A running proxy with one fake prefill and one fake decode engine registered over ZMQ."""

    proxy: ProxyServer
    prefill: FakeEngine
    decode: FakeEngine
    registrar: Registrar
    events: list[str]
    client: aiohttp.ClientSession
    extra: list[FakeEngine] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.api_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.admin_port}"

    async def post(self, path: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
        async with self.client.post(self.url + path, json=body, **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def stream(self, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, str]:
        async with self.client.post(self.url + path, json={**body, "stream": True}) as resp:
            return resp.status, (await resp.read()).decode()

    async def beat_and_probe(self, engine: FakeEngine, mode: str = "READ") -> None:
        """A heartbeat from ``engine`` after its circuit breaker opened, then one round of /health probes
        (what moves an open breaker to half-open)."""
        inst = self.proxy.registry.instances[engine.http_address]
        await self.registrar.send(engine.g2_registration(mode))
        await wait_for(
            lambda: (inst.last_heartbeat or 0) > (inst.breaker.opened_at or 0), what="a heartbeat after the opening"
        )
        assert self.proxy.housekeeping is not None
        await self.proxy.housekeeping.probe_all()


SetupFactory = Callable[..., Awaitable[PdSetup]]


@pytest.fixture
async def pd_setup() -> AsyncIterator[SetupFactory]:
    """Factory: ``await pd_setup(mode="WRITE", generation="G2", **proxy_config_overrides)``; with
    ``expect=True`` the proxy is told its two engines (``--expected-engine``), as the operator does."""
    created: list[PdSetup] = []

    async def make(
        mode: str = "WRITE", generation: str = "G2", register: bool = True, expect: bool = False, **overrides: Any
    ) -> PdSetup:
        events: list[str] = []
        prefill = FakeEngine("P", events, handshake_port=6301, notify_port=6105)
        decode = FakeEngine("D", events, handshake_port=7301, notify_port=7501)
        await prefill.start()
        await decode.start()
        if expect:
            overrides["expected_engines"] = tuple(json.dumps(e.g2_registration(mode)) for e in (prefill, decode))
        proxy = await start_proxy(proxy_config(**overrides))
        registrar = Registrar(proxy.config.registration_address)
        setup = PdSetup(proxy, prefill, decode, registrar, events, aiohttp.ClientSession())
        created.append(setup)
        if register:
            await register_pair(setup, mode, generation)
        return setup

    yield make
    for setup in created:
        await setup.client.close()
        setup.registrar.close()
        await setup.proxy.stop()
        for engine in (setup.prefill, setup.decode, *setup.extra):
            await engine.stop()


async def register_pair(setup: PdSetup, mode: str, generation: str) -> None:
    for engine in (setup.prefill, setup.decode):
        payload = engine.g2_registration(mode) if generation == "G2" else engine.g1_registration(mode)
        await setup.registrar.send(payload)
    await wait_for(lambda: not setup.proxy.not_ready_reason(), what="P and D registered")


async def second_instance(setup: PdSetup, role: str, mode: str = "READ", **knobs: Any) -> FakeEngine:
    """Another engine of ``role`` (P or D), registered after the first one, so round-robin tries it second."""
    engine = FakeEngine(role, setup.events, handshake_port=6311 if role == "P" else 7311, **knobs)
    await engine.start()
    setup.extra.append(engine)
    await setup.registrar.send(engine.g2_registration(mode))
    await wait_for(lambda: engine.http_address in setup.proxy.registry.instances, what="second instance")
    setup.proxy.registry.record_health(engine.http_address, True, time.monotonic())  # as its first /health probe would
    return engine
