"""Operations and client input: /health, /ready, admin /status and /metrics, bad input, API key,
colocated mode, the canary, graceful shutdown and the CLI."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from pd_runtime.proxy.cli import main
from tests.ports import TEST_PORTS
from tests.proxy.conftest import SetupFactory
from tests.proxy.proxy_fakes import FakeEngine, proxy_config, start_proxy, wait_for

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


async def _get_json(client: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with client.get(url) as resp:
        return resp.status, json.loads(await resp.read())


async def test_health_ready_and_status_follow_contract_3(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False, transfer_mode="write")
    assert (await _get_json(setup.client, setup.url + "/health"))[0] == 200
    status, ready = await _get_json(setup.client, setup.url + "/ready")
    assert status == 503 and ready["ready"] is False

    await setup.registrar.send(setup.prefill.g2_registration())
    await setup.registrar.send(setup.decode.g1_registration())
    await wait_for(lambda: not setup.proxy.not_ready_reason(), what="registration")
    assert (await _get_json(setup.client, setup.url + "/ready"))[0] == 200

    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    assert set(doc) == {
        "mode", "transfer_mode", "policy", "instances", "counts", "last_transfer", "canary", "config", "demand",
        "admission", "leaving",
    }  # fmt: skip
    assert doc["mode"] == "disaggregated" and doc["transfer_mode"] == "write" and doc["leaving"] is False
    assert doc["last_transfer"] is None
    assert doc["canary"] == {
        "enabled": False, "ok": None, "at": None, "error": None,
        "kv_match": None, "kv_mismatch": None, "serving_stopped": False,
    }  # fmt: skip
    assert doc["counts"] == {"prefill": 1, "decode": 1, "engines": 2, "in_flight": 0}
    by_role = {inst["role"]: inst for inst in doc["instances"]}
    prefill, decode = by_role["P"], by_role["D"]
    assert set(prefill) == {
        "role", "http_address", "zmq_address", "heartbeat_age_s", "healthy",
        "dp_size", "tp_size", "transfer_mode", "vllm_version", "generation", "in_flight", "routed", "load",
        "load_age_s", "moriio_metrics", "circuit",
    }  # fmt: skip
    assert prefill["circuit"] == {"state": "closed", "reason": None, "failures": 0}
    assert prefill["moriio_metrics"] is None  # a fake engine without vLLM main's transfer metrics
    assert prefill["http_address"] == setup.prefill.http_address
    assert prefill["zmq_address"] == "host:127.0.0.1,handshake:6301,notify:6105"
    assert isinstance(prefill["heartbeat_age_s"], float) and prefill["healthy"] is True
    assert (prefill["dp_size"], prefill["tp_size"], prefill["transfer_mode"]) == (1, 4, "WRITE")
    assert (prefill["generation"], decode["generation"]) == ("G2", "G1")
    # each engine's GET /version, read once it answered /health: the release it runs
    await wait_for(lambda: all(i.vllm_version for i in setup.proxy.registry.instances.values()), what="versions")
    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    versions = {inst["role"]: inst["vllm_version"] for inst in doc["instances"]}
    assert versions == {"P": "0.33.0+rocm723", "D": "0.33.0"}

    status, _ = await setup.post("/v1/completions", BODY)
    assert status == 200
    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    last = doc["last_transfer"]
    assert re.match(r"^tx-[0-9a-f-]{36}$", last["transfer_id"])
    assert last["transfer_id"] == setup.prefill.requests[0].body["kv_transfer_params"]["transfer_id"]
    assert RFC3339.match(last["completed_at"])
    assert (last["prefill"], last["decode"], last["source"]) == (
        setup.prefill.http_address,
        setup.decode.http_address,
        "request",
    )
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        (gauge,) = [line for line in (await resp.text()).splitlines() if line.startswith("pd_proxy_last_transfer_")]
    completed = datetime.fromisoformat(last["completed_at"].replace("Z", "+00:00")).timestamp()
    assert abs(float(gauge.split()[1]) - completed) < 0.01  # the gauge and /status tell the same transfer
    demand = doc["demand"]  # the client request counts, prompt length from prefill's usage
    assert (demand["arrivals"], demand["in_flight"], demand["queued"]) == (1, 0, 0)
    assert demand["output_tokens"] == {"requests": 1, "sum": 8}
    assert demand["prompt_tokens"] == {"requests": 1, "sum": 5}
    assert demand["requests_per_second"] > 0


async def test_metrics_are_prometheus_text(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    await setup.stream(BODY)
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        text = await resp.text()
    assert resp.status == 200
    for name in (
        'pd_proxy_requests_total{endpoint="completions",outcome="ok"} 1.0',
        "pd_proxy_ttft_seconds_count 1.0",
        "pd_proxy_itl_seconds_bucket",
        'pd_proxy_leg_seconds_count{leg="prefill"}',
        'pd_proxy_instances_live{role="P"} 1.0',
        'pd_proxy_registration_frames_total{result="added"}',
        "pd_proxy_evictions_total",
    ):
        assert name in text, name


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"\xff\xfe", None),
        (b"[1, 2]", None),
        (b'{"prompt": "x", "max_tokens": "8"}', "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 10000000000}', "max_tokens"),
        (b'{"prompt": "x", "max_completion_tokens": true}', "max_completion_tokens"),
        (b'{"prompt": "x", "stream": "yes"}', "stream"),
        (b'{"prompt": "x", "n": 2}', "n"),
        (b'{"prompt": "x", "best_of": 3}', "best_of"),
        (b'{"prompt": ["a", "b"]}', "prompt"),
        (b'{"prompt": [[1, 2], [3]]}', "prompt"),
        (b'{"prompt": ""}', "prompt"),
        (b'{"prompt": 5}', "prompt"),
        (b'{"max_tokens": 3}', "prompt"),
        (b'{"prompt": "x", "min_tokens": -1}', "min_tokens"),
        (b'{"prompt": "x", "stream_options": 3}', "stream_options"),
        (b"[" * 100_000 + b"]" * 100_000, None),
    ],
)
async def test_bad_input_gets_400_with_an_openai_body(pd_setup: SetupFactory, body: bytes, param: str | None) -> None:
    setup = await pd_setup(mode="WRITE")
    async with setup.client.post(setup.url + "/v1/completions", data=body) as resp:
        doc = json.loads(await resp.read())
    assert resp.status == 400
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["param"] == param
    assert setup.prefill.requests == [] and setup.decode.requests == []


async def test_chat_needs_messages(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    status, doc = await setup.post("/v1/chat/completions", {"model": "m", "messages": "hi"})
    assert status == 400 and doc["error"]["param"] == "messages"


async def test_a_single_token_id_prompt_passes(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    status, _ = await setup.post("/v1/completions", {"model": "m", "prompt": [101, 2023, 102], "max_tokens": 4})
    assert status == 200
    assert setup.prefill.requests[0].body["prompt"] == [101, 2023, 102]


async def test_routes_methods_and_sizes(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", max_body_bytes=1024)
    async with setup.client.get(setup.url + "/v1/nope") as resp:
        assert resp.status == 404 and "error" in json.loads(await resp.read())
    async with setup.client.get(setup.url + "/v1/completions") as resp:
        assert resp.status == 405 and "error" in json.loads(await resp.read())
    async with setup.client.post(setup.url + "/v1/completions", json={"prompt": "x" * 4096}) as resp:
        assert resp.status == 413 and json.loads(await resp.read())["error"]["code"] == "body_too_large"
    async with setup.client.get(setup.url + "/v1/models") as resp:
        assert resp.status == 200 and json.loads(await resp.read())["data"][0]["id"] == "fake-model"


async def test_client_api_key_is_required_when_configured(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", api_key="client-secret")
    status, doc = await setup.post("/v1/completions", BODY)
    assert status == 401 and doc["error"]["type"] == "authentication_error"
    status, _ = await setup.post("/v1/completions", BODY, headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, _ = await setup.post("/v1/completions", BODY, headers={"Authorization": "Bearer client-secret"})
    assert status == 200
    assert "Authorization" not in setup.prefill.requests[0].headers  # the client's key is not forwarded


async def test_colocated_mode_round_robins_static_engines_without_kv_params() -> None:
    events: list[str] = []
    engines = [FakeEngine("E", events), FakeEngine("E", events)]
    for engine in engines:
        await engine.start()
    proxy = await start_proxy(
        proxy_config(mode="colocated", engines=tuple(f"http://{e.http_address}" for e in engines))
    )
    try:
        await wait_for(lambda: not proxy.not_ready_reason(), what="engines probed healthy")
        async with aiohttp.ClientSession() as client:
            for _ in range(4):
                async with client.post(
                    f"http://127.0.0.1:{proxy.api_port}/v1/completions",
                    json={"model": "m", "prompt": ["a", "b"], "n": 2, "stream": True},
                ) as resp:
                    assert resp.status == 200
                    assert (await resp.read()).endswith(b"data: [DONE]\n\n")
            _status, doc = await _get_json(client, f"http://127.0.0.1:{proxy.admin_port}/status")
        assert [len(e.requests) for e in engines] == [2, 2]
        for req in engines[0].requests:
            assert "kv_transfer_params" not in req.body and re.match(r"^[0-9a-f]{32}$", req.headers["X-Request-Id"])
        assert doc["mode"] == "colocated" and doc["transfer_mode"] is None
        assert doc["counts"]["engines"] == 2
        assert {i["generation"] for i in doc["instances"]} == {"static"}
        assert {i["role"] for i in doc["instances"]} == {"E"}
    finally:
        await proxy.stop()
        for engine in engines:
            await engine.stop()


async def test_canary_verifies_a_transfer_and_reports_it(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", canary_interval_s=0.2)
    assert setup.proxy.canary is not None
    await wait_for(lambda: setup.proxy.canary.state.ok is True, what="canary success")
    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    assert doc["canary"]["enabled"] is True and doc["canary"]["error"] is None
    assert doc["canary"]["kv_match"] is True and doc["canary"]["kv_mismatch"] is None
    assert RFC3339.match(doc["canary"]["at"])
    assert doc["last_transfer"]["source"] == "canary"
    prefill_leg, reference = setup.prefill.requests[0].body, setup.prefill.requests[1].body
    assert prefill_leg["model"] == "fake-model" and "kv_transfer_params" in prefill_leg
    # the reference: the same greedy request on the same prefill engine, without KV transfer parameters
    assert "kv_transfer_params" not in reference
    assert reference["temperature"] == 0 and reference["return_token_ids"] is True
    assert setup.decode.requests[0].body["max_tokens"] == reference["max_tokens"]
    setup.prefill.null_params = True
    await wait_for(lambda: setup.proxy.canary.state.ok is False, what="canary failure")
    assert "verified" in (setup.proxy.canary.state.error or "")


async def _kv_canary_count(setup: Any, result: str) -> float:
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        text = await resp.text()
    line = f'pd_proxy_kv_canary_total{{result="{result}"}} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


async def test_canary_kv_mismatch_is_reported_and_kept(pd_setup: SetupFactory) -> None:
    """Decode answers 200 with other tokens than prefill computes whole: reported, with the position."""
    setup = await pd_setup(mode="WRITE", canary_interval_s=0.1)
    assert setup.proxy.canary is not None
    setup.decode.token_ids = [11, 99, 13]
    await wait_for(lambda: setup.proxy.canary.state.kv_match is False, what="canary mismatch")
    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    canary = doc["canary"]
    assert canary["ok"] is False and "KV mismatch" in canary["error"]
    mismatch = canary["kv_mismatch"]
    assert (mismatch["position"], mismatch["expected"], mismatch["got"], mismatch["compared"]) == (1, 12, 99, 3)
    assert mismatch["prefill"] == setup.prefill.http_address and mismatch["decode"] == setup.decode.http_address
    assert mismatch["transfer_id"].startswith("tx-") and "at token 1" in mismatch["message"]
    assert canary["serving_stopped"] is False  # report (the default): clients are still served
    assert (await setup.post("/v1/completions", BODY))[0] == 200
    assert await _kv_canary_count(setup, "mismatch") >= 1
    setup.decode.token_ids = [11, 12, 13]  # a later match does not clear it: the first mismatch is kept
    await wait_for(lambda: setup.proxy.canary.state.kv_match is True, what="canary match")
    assert setup.proxy.canary.state.kv_mismatch == mismatch
    assert await _kv_canary_count(setup, "match") >= 1


async def test_canary_kv_mismatch_stops_serving_when_told(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", canary_interval_s=0.1, on_kv_mismatch="stopServing")
    assert setup.proxy.canary is not None
    await wait_for(lambda: setup.proxy.canary.state.kv_match is True, what="canary match")
    assert (await _get_json(setup.client, setup.url + "/ready"))[0] == 200
    setup.decode.token_ids = [7, 12, 13]
    await wait_for(lambda: setup.proxy.canary.state.serving_stopped, what="serving stopped")
    status, ready = await _get_json(setup.client, setup.url + "/ready")
    assert status == 503 and "KV mismatch" in ready["reason"]
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 503
    error = body["error"]
    assert error["code"] == "kv_mismatch" and "at token 0" in error["message"]
    # report again (the settings file reloads it): serving resumes, the mismatch stays in /status
    setup.proxy.reconfigure(replace(setup.proxy.config, on_kv_mismatch="report"))
    assert (await setup.post("/v1/completions", BODY))[0] == 200
    assert setup.proxy.canary.state.kv_mismatch is not None


async def test_canary_without_token_ids_is_not_a_success(pd_setup: SetupFactory) -> None:
    """Fail closed: an engine that ignores return_token_ids leaves the KV unchecked, and the canary says so."""
    setup = await pd_setup(mode="WRITE", canary_interval_s=0.1)
    assert setup.proxy.canary is not None
    setup.prefill.token_ids = []
    await wait_for(lambda: "KV not checked" in (setup.proxy.canary.state.error or ""), what="an unchecked canary")
    state = setup.proxy.canary.state
    assert state.ok is False and state.kv_match is None and state.kv_mismatch is None
    assert "token_ids" in (state.error or "")
    assert await _kv_canary_count(setup, "unverified") >= 1


async def test_shutdown_drains_in_flight_streams(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.decode.chunks, setup.decode.chunk_interval = 10, 0.05
    stream = asyncio.create_task(setup.stream(BODY))
    await wait_for(lambda: setup.proxy.core.in_flight == 1, what="stream started")
    await setup.proxy.stop()
    status, text = await stream
    assert status == 200 and text.count("data: ") == 11 and text.endswith("data: [DONE]\n\n")


async def test_shutdown_serves_through_the_drain_delay_while_not_ready(pd_setup: SetupFactory) -> None:
    """A replica being removed keeps answering what reaches it until the Service has dropped it."""
    setup = await pd_setup(mode="WRITE", drain_delay_s=0.6)
    stopping = asyncio.create_task(setup.proxy.stop())
    await wait_for(lambda: setup.proxy.leaving, what="SIGTERM's stop begun")
    status, ready = await _get_json(setup.client, setup.url + "/ready")
    assert (status, ready) == (503, {"ready": False, "reason": "shutting down"})
    _, doc = await _get_json(setup.client, setup.admin_url + "/status")
    assert doc["leaving"] is True  # the engines' preStop hooks (pdctl wait-proxy-gone) wait for the drain
    status, text = await setup.stream(BODY)  # arrives during the delay: served whole
    assert status == 200 and text.endswith("data: [DONE]\n\n") and not stopping.done()
    await stopping
    assert setup.proxy.core.draining


def test_cli_reads_keys_from_the_named_env_vars() -> None:
    from pd_runtime.proxy.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--api-key-env", "CLIENT_KEY", "--transfer-mode", "read"])
    config = config_from_args(args, {"CLIENT_KEY": "c", "VLLM_API_KEY": "e"})
    assert (config.api_key, config.engine_api_key, config.transfer_mode) == ("c", "e", "read")
    config = config_from_args(args, {"CLIENT_KEY": ""})
    assert (config.api_key, config.engine_api_key) == (None, None)


def test_cli_exits_1_when_a_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr("pd_runtime.proxy.cli.configure", lambda level, fmt: None)  # keep pytest's logging

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            ["--port", str(port), "--admin-port", "0", "--registration-address", f"tcp://127.0.0.1:{TEST_PORTS.port()}"]
        )
    assert code == 1


def test_cli_rejects_inconsistent_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["--mode", "colocated", "--engine", "not-a-url"])
    with pytest.raises(SystemExit):
        main(["--heartbeat-ttl", "-1"])


def test_pdctl_proxy_runs_and_stops_on_sigterm() -> None:
    port, admin = TEST_PORTS.port(), TEST_PORTS.port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pd_runtime.cli", "proxy", "--port", str(port), "--admin-port", str(admin),
         "--registration-address", f"tcp://127.0.0.1:{TEST_PORTS.port()}", "--transfer-mode", "read"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "proxy ready to serve" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_flags_come_from_the_config_fields() -> None:
    """Each default exists once: no flags give ProxyConfig(), and every documented field has its flag."""
    import dataclasses

    from pd_runtime.proxy.cli import build_parser, config_from_args
    from pd_runtime.proxy.config import ProxyConfig, Timeouts

    parser = build_parser()
    assert config_from_args(parser.parse_args([]), {}) == ProxyConfig()
    args = parser.parse_args(["--kv-wait-timeout", "7", "--no-kv-fallback", "error", "--decode-max-in-flight", "3"])
    config = config_from_args(args, {})
    assert (config.timeouts.kv_wait, config.no_kv_fallback, config.decode_max_in_flight) == (7.0, "error", 3)
    documented = [f for cls in (ProxyConfig, Timeouts) for f in dataclasses.fields(cls) if "help" in f.metadata]
    process_flags = (
        "api_key_env",
        "engine_api_key_env",
        "admin_key_env",
        "loop",
        "log_level",
        "log_format",
    )  # not settings
    router_flags = ("router", "pddeployment", "namespace", "backend", "backend_port")  # RouterConfig's
    assert len(vars(parser.parse_args([]))) == len(documented) + len(process_flags) + len(router_flags)
    assert {"--engine", "--heartbeat-ttl", "--connect-timeout"} <= set(parser._option_string_actions)
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-kv-fallback", "decode"])
