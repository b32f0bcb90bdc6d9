"""`pdctl proxy --router`: one address for all replicas of a PDDeployment, balanced by their proxies' load.

Discovery: the ready endpoints of the PDDeployment's Service, from its EndpointSlices (listed, then
watched through the API server with the pod's ServiceAccount, which needs list and watch on
endpointslices only), or a fixed ``--backend`` list. Load: every ``--scrape-interval`` seconds each
proxy's admin ``/status`` (its requests in flight), combined with the router's own count
(``replicas.pick``). A request whose replica fails before answering (connection refused, reset) is
retried once on another replica; once the response has started, it streams through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pd_runtime.proxy.replicas import Replica, pick, ready_addresses, reported_in_flight

log = logging.getLogger(__name__)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "host", "content-length"})


@dataclass
class RouterConfig:
    port: int = 8000
    host: str = "0.0.0.0"
    backends: tuple[str, ...] = ()  # fixed host:port list instead of EndpointSlice discovery
    admin_addresses: dict[str, str] = field(default_factory=dict)  # backend -> its admin host:port, if not usual
    pddeployment: str | None = None
    namespace: str | None = None
    backend_port: int = 8000  # the proxies' API port
    admin_port: int = 8001  # the proxies' admin port (/status)
    admin_key: str | None = None  # sent to the proxies' admin port, which asks for it off loopback
    scrape_interval_s: float = 0.5
    api_server: str = "https://kubernetes.default.svc"


@dataclass
class Router:
    config: RouterConfig
    replicas: dict[str, Replica] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None

    # ---- discovery and load ----------------------------------------------------------------------------

    def set_ready(self, addresses: list[str]) -> None:
        kept = {a: self.replicas.get(a, Replica(a)) for a in addresses}
        if set(kept) != set(self.replicas):
            log.info("ready replicas: %s", ", ".join(kept) or "none")
        self.replicas = kept

    async def scrape(self) -> None:
        """Every replica proxy's reported in-flight count, all at once, so a slow one delays no other."""
        while True:
            addresses = list(self.replicas)
            reports = await asyncio.gather(*(self._reported(address) for address in addresses))
            for address, reported in zip(addresses, reports, strict=True):
                if reported is not None and address in self.replicas:
                    self.replicas[address] = replace(self.replicas[address], reported=reported)
            await asyncio.sleep(self.config.scrape_interval_s)

    async def _reported(self, address: str) -> int | None:
        """The in-flight count a replica's admin /status reports; None when it cannot be read."""
        assert self.session is not None
        admin = self.config.admin_addresses.get(address) or f"{address.rsplit(':', 1)[0]}:{self.config.admin_port}"
        headers = {"Authorization": f"Bearer {self.config.admin_key}"} if self.config.admin_key else {}
        timeout = aiohttp.ClientTimeout(total=1)
        try:
            async with self.session.get(f"http://{admin}/status", headers=headers, timeout=timeout) as resp:
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return reported_in_flight(body) if isinstance(body, dict) else None

    async def discover(self) -> None:
        """List the Service's EndpointSlices, then watch them; re-list after any error."""
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        path = f"{self.config.api_server}/apis/discovery.k8s.io/v1/namespaces/{self.config.namespace}/endpointslices"
        query = {"labelSelector": f"kubernetes.io/service-name={self.config.pddeployment}"}
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=context)) as api:
            while True:
                try:
                    async with api.get(path, params=query) as resp:
                        listing = await resp.json()
                    slices = {s["metadata"]["name"]: s for s in listing.get("items", [])}
                    self.set_ready(ready_addresses(slices.values(), self.config.backend_port))
                    watch = {**query, "watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"]}
                    async with api.get(path, params=watch, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                        async for line in resp.content:
                            event = json.loads(line)
                            obj = event["object"]
                            if event["type"] == "DELETED":
                                slices.pop(obj["metadata"]["name"], None)
                            elif event["type"] in ("ADDED", "MODIFIED"):
                                slices[obj["metadata"]["name"]] = obj
                            self.set_ready(ready_addresses(slices.values(), self.config.backend_port))
                except (aiohttp.ClientError, KeyError, ValueError, TimeoutError) as exc:
                    log.warning("EndpointSlice watch: %s; listing again", exc)
                    await asyncio.sleep(1)

    # ---- the relay ---------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _track(self, address: str) -> AsyncIterator[None]:
        current = self.replicas.get(address, Replica(address))
        self.replicas[address] = replace(current, in_flight=current.in_flight + 1, routed=current.routed + 1)
        try:
            yield
        finally:
            if address in self.replicas:
                now = self.replicas[address]
                self.replicas[address] = replace(now, in_flight=max(now.in_flight - 1, 0))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        tried: set[str] = set()
        for _ in range(2):
            chosen = pick(list(self.replicas.values()), frozenset(tried))
            if chosen is None:
                break
            tried.add(chosen.address)
            async with self._track(chosen.address):
                url = f"http://{chosen.address}{request.path_qs}"
                try:
                    upstream = await self.session.request(request.method, url, data=body, headers=headers)
                except aiohttp.ClientError as exc:
                    log.warning("replica %s failed before answering: %s", chosen.address, exc)
                    continue
                async with upstream:
                    out = web.StreamResponse(status=upstream.status)
                    out.headers.update({k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
                    await out.prepare(request)
                    try:
                        async for chunk in upstream.content.iter_any():
                            await out.write(chunk)
                        await out.write_eof()
                    except (ConnectionResetError, aiohttp.ClientError) as exc:
                        log.info("request to %s ended early: %s", chosen.address, exc)  # the client went away
                    return out
        error = {"error": {"message": "no ready replica", "type": "service_unavailable", "code": 503}}
        return web.json_response(error, status=503)

    async def status(self, _: web.Request) -> web.Response:
        replicas = [
            {"address": r.address, "in_flight": r.in_flight, "reported": r.reported, "routed": r.routed}
            for r in sorted(self.replicas.values(), key=lambda r: r.address)
        ]
        return web.json_response({"mode": "router", "replicas": replicas})

    async def ready(self, _: web.Request) -> web.Response:
        return web.json_response({"ready": bool(self.replicas)}, status=200 if self.replicas else 503)


async def serve(config: RouterConfig, stop: asyncio.Event) -> None:
    router = Router(config)
    router.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
    )
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/status", router.status)
    app.router.add_get("/ready", router.ready)
    app.router.add_get("/health", router.status)
    app.router.add_route("*", "/v1/{tail:.*}", router.handle)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(router.scrape())]
    if config.backends:
        router.set_ready(list(config.backends))
    else:
        tasks.append(asyncio.create_task(router.discover()))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("router listening on %s:%d", config.host, config.port)
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()
        await router.session.close()
