"""The API port's per-request handlers: the client key on each head and the completion routes.

They live apart from ``server.py`` so that mypyc compiles them with the rest of the request path: the
server module stays Python (its admin port's aiohttp middleware decorator sets an attribute on a
function), and a request's task passes through these handlers every time it resumes. No handler here
awaits inside an ``except`` clause: a compiled coroutine suspended there leaves its exception as the
thread's handled one, which would become the ``__context__`` that ``http1`` reads a refusal from.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping

from pd_runtime.proxy.admission_gate import AdmissionGate
from pd_runtime.proxy.canary import Canary
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.demand import asked_output_tokens
from pd_runtime.proxy.errors import ApiError, unavailable
from pd_runtime.proxy.flows import ProxyCore
from pd_runtime.proxy.http1 import HttpRequest, ResponseSink
from pd_runtime.proxy.legs import Endpoint, parse_client_request
from pd_runtime.proxy.metrics import ProxyMetrics

PUBLIC_PATHS = frozenset({"/health", "/ready"})
"""The API port's paths that need no client key: the kubelet's and load balancers' probes."""


class ApiHandlers:
    """What the API port runs per request; the settings are the core's (``ProxyCore.reconfigure``)."""

    def __init__(self, core: ProxyCore, admission: AdmissionGate, metrics: ProxyMetrics) -> None:
        self.core = core
        self.admission = admission
        self.metrics = metrics
        self.canary: Canary | None = None  # set once the server starts it

    def check_head(self, method: str, path: str, headers: Mapping[str, str]) -> ApiError | None:
        """The client key, checked on the request's head: a request without it is answered 401 and its
        connection closed before any of its body is read, so nothing unauthenticated holds memory. With a
        key set, every path needs it but the probes' (``PUBLIC_PATHS``), which take no body."""
        if path in PUBLIC_PATHS:
            if int(headers.get("content-length", "0")) == 0 and "transfer-encoding" not in headers:
                return None
            self.metrics.api_refused("unauthenticated")
            return ApiError(413, f"{path} takes no request body", code="body_too_large")
        expected = self.core.config.api_key
        if not expected:
            return None
        supplied = headers.get("authorization", "")
        if hmac.compare_digest(supplied.encode(), f"Bearer {expected}".encode()):
            return None
        self.metrics.api_refused("unauthenticated")
        return ApiError(401, "invalid or missing API key", type="authentication_error", code="invalid_api_key")

    async def completions(self, request: HttpRequest, sink: ResponseSink) -> None:
        await self._relay(request, sink, "completions")

    async def chat_completions(self, request: HttpRequest, sink: ResponseSink) -> None:
        await self._relay(request, sink, "chat/completions")

    def _refuse_after_kv_mismatch(self) -> None:
        """--on-kv-mismatch stopServing: wrong answers with HTTP 200 are worse than none. The mismatch, an
        attribute, is read first: the canary's ``stops_serving`` is Python, two interpreted calls."""
        canary = self.canary
        if canary is not None and canary.mismatch is not None and canary.stops_serving:
            raise unavailable(
                "the proxy stopped serving: its canary found wrong KV reaching decode: " + canary.mismatch.describe(),
                "kv_mismatch",
            )

    async def _relay(self, request: HttpRequest, sink: ResponseSink, endpoint: Endpoint) -> None:
        """Checks, then admission (``--max-in-flight``, a FIFO queue, 429 + Retry-After past it), then the
        engines, all by the request's one deadline, which starts here (docs/proxy.md, "Failure contract").
        A request refused by admission is demand too: it counts as an arrival (docs/proxy.md)."""
        config = self.core.config
        deadline = Deadline.after(self.core.loop.time(), config.timeouts.response)
        try:
            self._refuse_after_kv_mismatch()
            client_request = parse_client_request(
                request.body, endpoint, config.mode, config.max_tokens_limit, request.headers
            )
        except ApiError:
            self.metrics.request_done(endpoint, "rejected")
            raise
        self.core.demand.arrived(time.monotonic(), asked_output_tokens(client_request.body))
        served = False
        try:
            async with self.admission.admitted(deadline):
                served = True
                await self.core.handle(client_request, sink, deadline=deadline)
        except ApiError as err:  # refused by admission (429), its deadline passed (504), drained (503)
            self.metrics.request_done(endpoint, err.outcome)
            if err.cause is not None:
                self.metrics.failed(err.cause, "before_headers")
            raise
        except asyncio.CancelledError:
            if not served:  # the client left while queued (a served request is counted by handle)
                self.metrics.request_done(endpoint, "cancelled")
                self.metrics.failed("client_gone", "before_headers")
            raise
