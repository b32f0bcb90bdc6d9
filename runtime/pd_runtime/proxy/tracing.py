"""The proxy's own OpenTelemetry spans (the ``tracing`` extra), off unless ``--otlp-traces-endpoint`` is set.

Each client request is one SERVER span, a child of the client's ``traceparent`` when it sent a valid one
(else the root of a new trace); each leg is a CLIENT span under it, and the leg carries that span's
context as its ``traceparent`` (with the client's ``tracestate``), so a trace reads client -> proxy ->
prefill and decode, and the engines' own spans (vLLM's ``--otlp-traces-endpoint``) hang below the legs.
Spans go out in batches over OTLP/HTTP (docs/proxy.md, "Trace context").

OpenTelemetry is imported only here and only when tracing is on, so the proxy runs without the extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

EXTRA_HINT = "pip install 'pd-operator[tracing]'"
_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


class TracingUnavailable(RuntimeError):
    """--otlp-traces-endpoint is set, but the tracing extra is not installed."""


class Answered(Protocol):
    @property
    def status(self) -> int: ...


Response = TypeVar("Response", bound=Answered)


def missing() -> str | None:
    """Why tracing cannot run here (the extra is not installed), or None when it can."""
    for name in _MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"--otlp-traces-endpoint needs OpenTelemetry ({name} is not installed): {EXTRA_HINT}"
    return None


class Tracing:
    """Spans for requests and legs, exported by ``exporter`` (default: OTLP/HTTP to ``endpoint``)."""

    def __init__(self, endpoint: str, service_name: str = "pd-proxy", exporter: SpanExporter | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, Status, StatusCode
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter(endpoint=endpoint)
        except ImportError as exc:
            raise TracingUnavailable(
                f"--otlp-traces-endpoint needs OpenTelemetry, which is not installed ({exc.name}): {EXTRA_HINT}"
            ) from exc
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("pd_runtime.proxy")
        self._propagator = TraceContextTextMapPropagator()
        self._server, self._client = SpanKind.SERVER, SpanKind.CLIENT
        self._error: Callable[[str], Any] = lambda message: Status(StatusCode.ERROR, message)

    @contextlib.contextmanager
    def request(self, path: str, client_trace: Mapping[str, str], attributes: Mapping[str, Any]) -> Iterator[Any]:
        """The span of one client request, current (contextvars) while it runs: the legs' tasks, created
        inside, inherit it. ``client_trace`` is the client's valid trace context (``legs.trace_headers``)."""
        parent = self._propagator.extract(dict(client_trace))
        with self._tracer.start_as_current_span(
            f"POST {path}", context=parent, kind=self._server, attributes=dict(attributes)
        ) as span:
            yield span

    @contextlib.asynccontextmanager
    async def leg(
        self,
        name: str,
        address: str,
        headers: Mapping[str, str],
        post: Callable[[dict[str, str]], AbstractAsyncContextManager[Response]],
    ) -> AsyncIterator[Response]:
        """A CLIENT span around one upstream leg, a child of the current request span; ``post`` gets the
        leg's headers with this span's ``traceparent`` (and the trace's ``tracestate``) in place of the client's."""
        with self._tracer.start_as_current_span(
            name, kind=self._client, attributes={"pd.leg": name, "server.address": address}
        ) as span:
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            traced = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")} | carrier
            async with post(traced) as resp:
                span.set_attribute("http.response.status_code", resp.status)
                yield resp

    def finished(self, span: Any, outcome: str, attributes: Mapping[str, str]) -> None:
        """The request's outcome on its span (an error status unless ``ok``)."""
        span.set_attributes({"pd.outcome": outcome, **attributes})
        if outcome != "ok":
            span.set_status(self._error(outcome))

    def shutdown(self) -> None:
        """Export what is buffered and stop (the proxy's shutdown)."""
        self._provider.shutdown()
