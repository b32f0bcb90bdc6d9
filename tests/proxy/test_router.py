"""`pdctl proxy --router` over real HTTP: two replica proxies (small aiohttp servers that answer like one),
the router in front; requests go to the less loaded replica, survive a dead one, and stream through."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from pd_runtime.localports import PortReservation, bound_socket
from pd_runtime.proxy.router import Router, RouterConfig, serve


@dataclass
class FakeReplica:
    """The API and admin ports of one replica's proxy; ``hold`` keeps requests open until released."""

    name: str
    reported: int = 0
    served: Counter[str] = field(default_factory=Counter)
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.served["requests"] += 1
        await self.hold.wait()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(f'data: {{"replica": "{self.name}"}}\n\n'.encode())
        await out.write(b"data: [DONE]\n\n")
        return out

    async def status(self, request: web.Request) -> web.Response:
        self.served[request.headers.get("Authorization", "no key")] += 1
        return web.json_response({"in_flight": self.reported})


async def start_replica(replica: FakeReplica) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/v1/completions", replica.completions)
    app.router.add_get("/status", replica.status)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = bound_socket()
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]


@pytest.fixture
async def router_with(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[FakeReplica]]]:
    """A router over the replicas named by the test's parameter (a dead one: a closed port)."""
    replicas = [FakeReplica("a"), FakeReplica("b")]
    runners, backends = [], []
    for replica in replicas:
        runner, port = await start_replica(replica)
        runners.append(runner)
        backends.append(f"127.0.0.1:{port}")
    ports = PortReservation()  # held, never listening: a dead replica and a closed admin port
    if getattr(request, "param", False):
        backends.insert(0, f"127.0.0.1:{ports.port()}")
    # All fakes share one host, so their admin port would be one port: point it at a closed one (no
    # reports; the router's own in-flight counts decide). The reports' part is tested in the policy's tests.
    port = ports.port()
    config = RouterConfig(port=port, host="127.0.0.1", backends=tuple(backends), admin_port=ports.port())
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop))
    async with aiohttp.ClientSession() as client:
        for _ in range(100):
            try:
                async with client.get(f"http://127.0.0.1:{port}/ready") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.02)
    yield f"http://127.0.0.1:{port}", replicas
    ports.release()
    stop.set()
    await task
    for runner in runners:
        await runner.cleanup()


async def complete(client: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with client.post(f"{base}/v1/completions", json={"prompt": "x", "stream": True}) as resp:
        return resp.status, await resp.text()


async def test_requests_spread_to_the_replica_with_less_in_flight(router_with: tuple[str, list[FakeReplica]]) -> None:
    base, (a, b) = router_with
    async with aiohttp.ClientSession() as client:
        pending = [asyncio.create_task(complete(client, base)) for _ in range(4)]
        for _ in range(100):
            if a.served["requests"] + b.served["requests"] == 4:
                break
            await asyncio.sleep(0.02)
        assert (a.served["requests"], b.served["requests"]) == (2, 2), "four held requests: two each"
        a.hold.set()
        b.hold.set()
        results = await asyncio.gather(*pending)
    assert all(status == 200 and text.endswith("data: [DONE]\n\n") for status, text in results)


@pytest.mark.parametrize("router_with", [True], indirect=True)
async def test_a_dead_replica_is_retried_once_on_another(router_with: tuple[str, list[FakeReplica]]) -> None:
    base, replicas = router_with
    for replica in replicas:
        replica.hold.set()
    async with aiohttp.ClientSession() as client:
        results = [await complete(client, base) for _ in range(4)]
    assert [status for status, _ in results] == [200] * 4
    assert sum(r.served["requests"] for r in replicas) == 4


async def test_router_status_lists_the_replicas(router_with: tuple[str, list[FakeReplica]]) -> None:
    base, _ = router_with
    async with aiohttp.ClientSession() as client, client.get(f"{base}/status") as resp:
        body = await resp.json()
    assert body["mode"] == "router" and len(body["replicas"]) == 2


def test_router_mode_needs_a_pddeployment_or_backends() -> None:
    from pd_runtime.proxy import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--router"])
    assert exit_info.value.code == 2
    args = cli.build_parser().parse_args(["--router", "--backend", "10.0.0.1:8000=10.0.0.1:9001", "--port", "9000"])
    config = cli.router_config(args, {"PD_PROXY_ADMIN_KEY": "a"})
    assert config.backends == ("10.0.0.1:8000",) and config.admin_addresses == {"10.0.0.1:8000": "10.0.0.1:9001"}
    assert config.admin_key == "a"


async def test_the_router_reads_each_replicas_status_with_the_admin_key() -> None:
    replica = FakeReplica("a", reported=3)
    runner, port = await start_replica(replica)
    address = f"127.0.0.1:{port}"
    router = Router(RouterConfig(admin_addresses={address: address}, admin_key="admin-secret"))
    async with aiohttp.ClientSession() as session:
        router.session = session
        assert await router._reported(address) == 3
    await runner.cleanup()
    assert replica.served == Counter({"Bearer admin-secret": 1})
