"""The proxy process: API port (OpenAI routes, /health, /ready) and admin port (/status, /metrics).

Handlers only gather inputs and call the core; ``ProxyServer`` wires the parts and owns start/stop,
including the graceful drain on shutdown. The API port is served by ``http1`` (the request path's
server), the admin port by aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pd_runtime.proxy.admin_auth import admitted
from pd_runtime.proxy.admission_gate import AdmissionGate
from pd_runtime.proxy.api import ApiHandlers
from pd_runtime.proxy.canary import Canary
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.errors import ApiError, unavailable
from pd_runtime.proxy.flows import ProxyCore
from pd_runtime.proxy.gate import parse_expected_engine
from pd_runtime.proxy.http1 import ApiServer, Handler, HttpRequest, Limits, ResponseSink
from pd_runtime.proxy.listener import Housekeeping, RegistrationListener
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Registry, static_engine
from pd_runtime.proxy.reload import ReloadState
from pd_runtime.proxy.routing import Router
from pd_runtime.proxy.status import build_status
from pd_runtime.proxy.watcher import SettingsWatcher

log = logging.getLogger(__name__)

AdminHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(document: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(document).encode(), content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return web.Response(status=err.status, body=err.json_bytes(), headers=err.headers())


@web.middleware
async def openai_errors(request: web.Request, handler: AdminHandler) -> web.StreamResponse:
    """Every failure, including aiohttp's own 404/405, leaves as an OpenAI-style JSON body."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status)
        return error_response(ApiError(exc.status, exc.reason, code=code))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal proxy error", type="server_error", code="internal_error"))


def api_limits(config: ProxyConfig) -> Limits:
    return Limits(config.max_body_bytes, config.body_budget_bytes, config.max_connections, config.head_timeout_s)


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        static = [static_engine(url) for url in config.engines]
        expected = [parse_expected_engine(text) for text in config.expected_engines]
        self.registry = Registry(
            config.mode,
            config.transfer_mode,
            config.heartbeat_ttl_s,
            static,
            config.load_interval_s,
            expected=expected or None,
            max_instances=config.max_instances,
            engine_host=config.engine_host,
        )
        self.metrics = ProxyMetrics(self.registry)
        self.watcher = SettingsWatcher(config, self.metrics) if config.config_file else None
        config = self.watcher.initial() if self.watcher else config
        self.config = config
        router = Router(config.policy, config.affinity_max_imbalance)
        self.core = ProxyCore(config, self.registry, router, self.metrics)
        self.admission = AdmissionGate(
            config.max_in_flight, config.max_queued, config.queue_timeout_s, self.metrics, time.monotonic
        )
        self.handlers = ApiHandlers(self.core, self.admission, self.metrics)
        self.listener = RegistrationListener(config.registration_address, self.registry, self.metrics)
        self.canary: Canary | None = None
        self.housekeeping: Housekeeping | None = None
        self._api: ApiServer | None = None
        self._runners: list[web.AppRunner] = []
        self.api_port = 0
        self.admin_port: int | None = None
        self.leaving = False  # SIGTERM came: /ready answers 503 (requests are served until core.draining)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.core.start()
        assert self.core.session is not None
        self.listener.start()
        self.housekeeping = Housekeeping(
            self.registry,
            self.metrics,
            self.core.session,
            self.config.health_interval_s,
            self.config.timeouts.health,
            self.config.engine_api_key,
            self.config.load_interval_s,
        )
        self.housekeeping.start()
        self.listener.on_added = self.housekeeping.probe_soon
        self.canary = self.handlers.canary = Canary(self.core, self.config)
        self.canary.start()
        if self.watcher is not None:
            self.watcher.start(self.reconfigure)
        sock = _listen(self.config.host, self.config.port, self.config.backlog)
        self._api = ApiServer(
            self._api_routes(), api_limits(self.config), self.handlers.check_head, self.metrics.api_refused
        )
        await self._api.start(sock, self.config.backlog)
        api = self._api
        self.metrics.request_bytes_held.set_function(lambda: api.held_bytes)
        self.metrics.client_connections.set_function(lambda: len(api.connections))
        self.api_port = sock.getsockname()[1]
        if self.config.admin_port is not None:
            admin_host = self.config.admin_host or self.config.host
            self.admin_port = await self._serve(self._admin_app(), admin_host, self.config.admin_port)
        log.info(
            "proxy ready to serve mode=%s transfer_mode=%s api=%s:%d admin=%s",
            self.config.mode,
            self.config.transfer_mode,
            self.config.host,
            self.api_port,
            self.admin_port,
        )

    async def _serve(self, app: web.Application, host: str, port: int) -> int:
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=self.config.drain_timeout_s, access_log=None
        )
        await runner.setup()
        sock = _listen(host, port, self.config.backlog)
        await web.SockSite(runner, sock, backlog=self.config.backlog).start()
        self._runners.append(runner)
        bound: int = sock.getsockname()[1]
        return bound

    def reconfigure(self, config: ProxyConfig) -> None:
        """Run with new reloadable settings (reload.py): requests already under way keep their deadlines."""
        self.config = config
        self.core.reconfigure(config)
        self.admission.reconfigure(config.max_in_flight, config.max_queued, config.queue_timeout_s)
        if self.housekeeping is not None:
            self.housekeeping.health_timeout_s = config.timeouts.health
        if self.canary is not None:
            self.canary.config = config

    async def stop(self) -> None:
        """Graceful: /ready false at once, requests still served for ``drain_delay_s`` (the Service drops
        this replica meanwhile), then no more taken (503), in-flight streams finish, and close."""
        self.leaving = True
        if self.config.drain_delay_s > 0:
            log.info("leaving: /ready 503, serving for %gs more", self.config.drain_delay_s)
            await asyncio.sleep(self.config.drain_delay_s)
        self.core.draining = True
        self.admission.drain(unavailable("the proxy is shutting down", "shutting_down"))
        if self.watcher is not None:
            await self.watcher.stop()
        log.info("draining in_flight=%d timeout=%gs", self.core.in_flight, self.config.drain_timeout_s)
        if self.canary is not None:
            await self.canary.stop()
        if self._api is not None:  # the API port first: /status stays readable while streams drain
            await self._api.stop(self.config.drain_timeout_s)
        for runner in self._runners:
            await runner.cleanup()
        if self.housekeeping is not None:
            await self.housekeeping.stop()
        await self.listener.stop()
        await self.core.close()
        log.info("proxy stopped")

    # -- API port ------------------------------------------------------------------------------

    def _api_routes(self) -> dict[str, dict[str, Handler]]:
        return {
            "/v1/completions": {"POST": self.handlers.completions},
            "/v1/chat/completions": {"POST": self.handlers.chat_completions},
            "/v1/models": {"GET": self._models},
            "/health": {"GET": self._health},
            "/ready": {"GET": self._ready},
        }

    async def _models(self, request: HttpRequest, sink: ResponseSink) -> None:
        """The engines' own model list, from a live decode engine (or any engine when colocated)."""
        now = time.monotonic()
        live = self.registry.live("D", now) or self.registry.live(None, now)
        if not live:
            raise unavailable("no live engine to list models", "no_engine")
        assert self.core.session is not None
        headers = {"Authorization": f"Bearer {self.config.engine_api_key}"} if self.config.engine_api_key else {}
        try:
            async with asyncio.timeout(self.config.timeouts.health):
                async with self.core.session.get(f"{live[0].base_url}/v1/models", headers=headers) as resp:
                    body, status = await resp.read(), resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ApiError(
                502, "engine did not answer /v1/models", type="upstream_error", code="upstream_error"
            ) from exc
        await sink.whole(status, "application/json", body)

    async def _health(self, request: HttpRequest, sink: ResponseSink) -> None:
        await sink.whole(200, "application/json", json.dumps({"status": "ok"}).encode())

    async def _ready(self, request: HttpRequest, sink: ResponseSink) -> None:
        reason = self.not_ready_reason()
        document = {"ready": False, "reason": reason} if reason else {"ready": True}
        await sink.whole(503 if reason else 200, "application/json", json.dumps(document).encode())

    def not_ready_reason(self) -> str:
        if self.leaving:
            return "shutting down"
        if self.canary is not None and self.canary.stops_serving:
            return "stopped serving after a KV mismatch (on-kv-mismatch stopServing)"
        now = time.monotonic()
        if self.config.mode == "colocated":
            return "" if self.registry.live(None, now) else "no live engine"
        missing = [
            name
            for name, live in (("prefill", self.registry.live("P", now)), ("decode", self.registry.live("D", now)))
            if not live
        ]
        return f"no live {' or '.join(missing)} instance" if missing else ""

    # -- admin port ----------------------------------------------------------------------------

    def _admin_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors])
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        return app

    def status(self) -> dict[str, Any]:
        assert self.canary is not None
        document = build_status(
            self.registry,
            self.core.router,
            time.monotonic(),
            self.core.in_flight,
            self.core.last_transfer,
            self.canary.state,
        )
        reload_state = self.watcher.state if self.watcher else ReloadState(file=None)
        document["config"] = reload_state.to_json(self.config)
        document["admission"] = self.admission.state.to_json()
        queued = self.core.decode_queue + self.admission.state.queued
        document["demand"] = self.core.demand.report(time.monotonic(), self.core.in_flight, queued)
        document["leaving"] = self.leaving  # SIGTERM came: the engines' preStop hooks wait for the drain
        return document

    async def _status(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization", "")
        if not admitted(request.remote, authorization, self.config.admin_key, self.config.network):
            raise ApiError(401, "invalid or missing admin key", type="authentication_error", code="invalid_admin_key")
        return json_response(self.status())

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
