from __future__ import annotations

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
                import json

                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def stream(self, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, str]:
        async with self.client.post(self.url + path, json={**body, "stream": True}) as resp:
            return resp.status, (await resp.read()).decode()


SetupFactory = Callable[..., Awaitable[PdSetup]]


@pytest.fixture
async def pd_setup() -> AsyncIterator[SetupFactory]:
    """Factory: ``await pd_setup(mode="WRITE", generation="G2", **proxy_config_overrides)``."""
    created: list[PdSetup] = []

    async def make(mode: str = "WRITE", generation: str = "G2", register: bool = True, **overrides: Any) -> PdSetup:
        events: list[str] = []
        prefill = FakeEngine("P", events, handshake_port=6301, notify_port=6105)
        decode = FakeEngine("D", events, handshake_port=7301, notify_port=7501)
        await prefill.start()
        await decode.start()
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
