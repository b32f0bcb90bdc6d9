"""The proxy's own OpenTelemetry spans (docs/proxy.md, "Trace context"): a request span parented to the
client's traceparent, a span per leg under it, and each leg's traceparent naming its own span. Spans are
read from the SDK's in-memory exporter; the proxy runs, and says what is missing, without the extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pd_runtime.localports import bound_socket
from pd_runtime.proxy import cli, tracing
from pd_runtime.proxy.tracing import Tracing, TracingUnavailable
from tests.proxy.conftest import PdSetup, SetupFactory
from tests.proxy.proxy_fakes import wait_for

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"
HEADERS = {"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01", "tracestate": "vendor=opaque"}
BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}


async def _traced(pd_setup: SetupFactory, mode: str) -> tuple[PdSetup, InMemorySpanExporter]:
    setup = await pd_setup(mode=mode)
    exporter = InMemorySpanExporter()
    setup.proxy.core.tracing = Tracing("in-memory", exporter=exporter)
    return setup, exporter


async def _spans(setup: PdSetup, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The spans once the request is over: its span ends as the handler returns, and a write-mode prefill
    leg may still be answering in the background after decode's stream ended."""
    core = setup.proxy.core
    await wait_for(lambda: core.in_flight == 0 and not core._background, what="the request and its legs done")
    assert core.tracing is not None
    core.tracing.shutdown()  # exports what the batch processor holds
    return {span.name: span for span in exporter.get_finished_spans()}


def _traceparent(trace_id: str, span: ReadableSpan) -> str:
    """What a leg carries for ``span``: sampled (OpenTelemetry also sets the random-trace-id flag, 0x02)."""
    flags = int(span.context.trace_flags)
    assert flags & 1
    return f"00-{trace_id}-{_hex(span.context.span_id, 16)}-{flags:02x}"


def _hex(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_spans_parent_to_the_client_and_the_legs_to_them(pd_setup: SetupFactory, mode: str) -> None:
    setup, exporter = await _traced(pd_setup, mode)
    status, _ = await setup.post("/v1/completions", {**BODY, "stream": True}, headers=HEADERS)
    assert status == 200
    spans = await _spans(setup, exporter)
    request, prefill, decode = spans["POST /v1/completions"], spans["prefill"], spans["decode"]
    assert request.kind is SpanKind.SERVER and request.parent is not None
    assert _hex(request.context.trace_id, 32) == TRACE_ID and _hex(request.parent.span_id, 16) == CLIENT_PARENT
    assert request.attributes is not None and request.attributes["pd.outcome"] == "ok"
    assert str(request.attributes["pd.transfer_id"]).startswith("tx-")
    for span, engine in ((prefill, setup.prefill), (decode, setup.decode)):
        assert span.kind is SpanKind.CLIENT and span.parent is not None
        assert span.parent.span_id == request.context.span_id and span.context.trace_id == request.context.trace_id
        assert span.attributes is not None and span.attributes["server.address"] == engine.http_address
        assert span.attributes["http.response.status_code"] == 200
        (leg,) = engine.requests
        assert leg.headers["traceparent"] == _traceparent(TRACE_ID, span)
        assert leg.headers["tracestate"] == "vendor=opaque"


async def test_without_a_client_trace_the_request_span_starts_one(pd_setup: SetupFactory) -> None:
    setup, exporter = await _traced(pd_setup, "READ")
    status, _ = await setup.post("/v1/completions", BODY)
    assert status == 200
    spans = await _spans(setup, exporter)
    request = spans["POST /v1/completions"]
    assert request.parent is None
    trace_id = _hex(request.context.trace_id, 32)
    for engine, leg in ((setup.prefill, "prefill"), (setup.decode, "decode")):
        (recorded,) = engine.requests
        assert recorded.headers["traceparent"] == _traceparent(trace_id, spans[leg])
        assert "tracestate" not in recorded.headers


async def test_a_failed_request_has_an_error_status(pd_setup: SetupFactory) -> None:
    setup, exporter = await _traced(pd_setup, "READ")
    setup.prefill.status = 500
    status, _ = await setup.post("/v1/completions", BODY, headers=HEADERS)
    assert status == 502
    spans = await _spans(setup, exporter)
    request = spans["POST /v1/completions"]
    assert request.status.status_code is StatusCode.ERROR and request.status.description == "prefill_http"
    assert spans["prefill"].attributes is not None and spans["prefill"].attributes["http.response.status_code"] == 500


async def test_spans_reach_an_otlp_http_collector(pd_setup: SetupFactory) -> None:
    """The real exporter, over real HTTP: what a collector at --otlp-traces-endpoint receives."""
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = bound_socket()
    await web.SockSite(runner, sock).start()
    try:
        setup = await pd_setup(mode="READ")
        core = setup.proxy.core
        core.tracing = Tracing(f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces")
        status, _ = await setup.post("/v1/completions", BODY, headers=HEADERS)
        assert status == 200
        await wait_for(lambda: core.in_flight == 0, what="the request done")
        await asyncio.to_thread(core.tracing.shutdown)  # the export blocks: this loop serves the collector
    finally:
        await runner.cleanup()
    spans = [span for batch in received for rs in batch.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert sorted(span.name for span in spans) == ["POST /v1/completions", "decode", "prefill"]
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    service = {a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes}
    assert service["service.name"] == "pd-proxy"


def test_the_proxy_imports_without_opentelemetry() -> None:
    """Off by default: nothing on the proxy's path imports OpenTelemetry (the tracing extra is optional)."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import pd_runtime.proxy.server, pd_runtime.proxy.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_without_the_extra_the_flag_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    assert "pd-operator[tracing]" in (tracing.missing() or "")
    with pytest.raises(TracingUnavailable, match=r"pd-operator\[tracing\]"):
        Tracing("http://127.0.0.1:4318/v1/traces")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces"])
    assert exit_.value.code == 2 and "pip install 'pd-operator[tracing]'" in capsys.readouterr().err


def test_with_the_extra_nothing_is_missing() -> None:
    assert tracing.missing() is None
