"""The HTTP surface: vLLM-shaped answers, errors and fault knobs, over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from pd_runtime.sim.scheduler import Step, TokenEvent
from tests.ports import TEST_PORTS
from tests.sim.sim_helpers import EngineFactory, engine_ports, kv_config, metric, scrape, until_metric

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    url: str,
    body: Any,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.post(url + path, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json()


def sse_events(raw: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_health_models_metrics_and_version(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    port = str(TEST_PORTS.port())
    eng = await start_engine(["my/model", "--port", port, "--served-model-name", "a", "b", "--vllm-version", "0.33.0"])
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 200
    async with http.get(eng.url + "/version") as resp:
        assert await resp.json() == {"version": "0.33.0"}  # vLLM's answer, with the release it reproduces
    async with http.get(eng.url + "/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["a", "b"]
    text = await scrape(http, eng.url)
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert name in text


async def test_streaming_with_usage_and_request_id(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port())])
    body = {"prompt": [1, 2, 3], "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(eng.url + "/v1/completions", json=body, headers={"X-Request-Id": "abc"}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await resp.text())
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None] * 4 + ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    assert re.fullmatch(r"cmpl-abc-0-[0-9a-f]{8}", events[0]["id"])
    async with http.get(eng.url + "/debug/requests") as resp:
        record = (await resp.json())["requests"][-1]
    assert record["x_request_id"] == "abc" and record["completion_tokens"] == 5
    assert record["arrival"] <= record["first_token"] <= record["last_token"]


async def test_chat_streaming(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "--no-sim-request-id-suffix"])
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    async with http.post(eng.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "q"}) as resp:
        events = sse_events(await resp.text())
    assert events[0]["id"] == "chatcmpl-q" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    status, answer = await call(http, eng.url, {**body, "stream": False}, "/v1/chat/completions")
    assert status == 200 and answer["object"] == "chat.completion"


async def test_bad_input_gets_openai_errors(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "-dp", "2", "--max-model-len", "100"])
    async with http.post(eng.url + "/v1/completions", data=b"{not json") as resp:
        assert resp.status == 400 and "error" in await resp.json()
    status, body = await call(http, eng.url, {"prompt": "x", "model": "other"})
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    status, body = await call(http, eng.url, {"prompt": "x"}, headers={"X-data-parallel-rank": "2"})
    assert status == 400 and body["error"]["message"] == "data_parallel_rank 2 out of range"
    status, _ = await call(http, eng.url, {"prompt": "x"}, headers={"X-data-parallel-rank": "1"})
    assert status == 200
    status, body = await call(http, eng.url, {"prompt": "x", "max_tokens": 200})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    status, _ = await call(http, eng.url, [1, 2])
    assert status == 400


def producer_argv(*extra: str, read: bool = True) -> list[str]:
    ports = engine_ports()
    return ["m", "--port", str(ports.http), "--kv-transfer-config", kv_config("kv_producer", ports, read), *extra]


P_LEG = {"prompt": [1] * 10, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "tx-1"}}


async def test_eos_first_token_gives_null_params(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(producer_argv("--sim-eos-first-token"))
    status, body = await call(http, eng.url, P_LEG)
    assert status == 200 and body["kv_transfer_params"] is None
    assert body["choices"][0]["finish_reason"] == "stop"
    status, body = await call(http, eng.url, {"prompt": "plain", "max_tokens": 8})
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 1


async def test_min_tokens_masks_the_eos_as_vllm_does(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    """vLLM's MinTokensLogitsProcessor: no stop token among the first min_tokens, so a prefill leg with
    min_tokens 1 ends length-capped and keeps its KV, and a plain request's earliest EOS is min_tokens + 1."""
    eng = await start_engine(producer_argv("--sim-eos-first-token"))
    status, body = await call(http, eng.url, {**P_LEG, "min_tokens": 1})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["kv_transfer_params"]["transfer_id"] == "tx-1"
    status, body = await call(http, eng.url, {"prompt": "plain", "max_tokens": 8, "min_tokens": 3})
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("code", [404, 503])
async def test_prefill_error_knob(start_engine: EngineFactory, http: aiohttp.ClientSession, code: int) -> None:
    eng = await start_engine(producer_argv("--sim-prefill-error", str(code)))
    status, body = await call(http, eng.url, P_LEG)
    assert status == code and body["error"]["code"] == code
    status, _ = await call(http, eng.url, {"prompt": "plain requests still work"})
    assert status == 200


async def test_producer_needs_a_transfer_id_and_in_write_mode_a_peer(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await start_engine(producer_argv(read=False))
    status, body = await call(http, eng.url, {**P_LEG, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 500 and "transfer_id" in body["error"]["message"]
    status, body = await call(http, eng.url, P_LEG, headers={"X-Request-Id": "no-peer-here"})
    assert status == 400 and "decode engine" in body["error"]["message"]
    text = await scrape(http, eng.url)
    assert metric(text, "pd_sim_kv_blocks_held") == 0


def consumer_argv(version: str, read: bool) -> list[str]:
    ports = engine_ports()
    kv = kv_config("kv_consumer", ports, read)
    return ["m", "--port", str(ports.http), "--kv-transfer-config", kv, "--vllm-version", version]


PLAIN = {"prompt": [1] * 40, "max_tokens": 3}


@pytest.mark.parametrize(("version", "waits"), [("0.29.0", True), ("0.31.0", True), ("0.32.0", False)])
async def test_a_plain_request_on_a_write_mode_decode_engine(
    start_engine: EngineFactory, http: aiohttp.ClientSession, version: str, waits: bool
) -> None:
    """vLLM < 0.32 treats it as a remote prefill and waits for KV nobody sends; 0.32 serves it."""
    eng = await start_engine(consumer_argv(version, read=False))
    request = asyncio.create_task(call(http, eng.url, PLAIN))
    # Waiting: still not answered after 1 s (a loaded machine cannot answer it sooner); served: answered,
    # however long a loaded machine takes.
    done, _ = await asyncio.wait({request}, timeout=1.0 if waits else 30.0)
    assert bool(done) is not waits
    assert metric(await scrape(http, eng.url), "pd_sim_requests_waiting_for_kv") == (1 if waits else 0)
    request.cancel()  # the client goes away: the engine aborts the request
    await asyncio.gather(request, return_exceptions=True)
    assert (
        metric(await until_metric(http, eng.url, "pd_sim_requests_waiting_for_kv", 0), "pd_sim_requests_waiting_for_kv")
        == 0
    )


@pytest.mark.parametrize(("version", "wrong"), [("0.29.0", True), ("0.32.0", True), ("0.33.0", False)])
async def test_a_plain_request_on_a_read_mode_decode_engine(
    start_engine: EngineFactory, http: aiohttp.ClientSession, version: str, wrong: bool
) -> None:
    """vLLM < 0.33 claims the prompt's KV as loaded without loading it: an answer, silently wrong."""
    eng = await start_engine(consumer_argv(version, read=True))
    status, body = await call(http, eng.url, PLAIN)
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    assert metric(await scrape(http, eng.url), "pd_sim_requests_decoded_without_kv_total") == (1 if wrong else 0)


async def test_a_request_aborted_during_its_final_step_leaves_the_engine_serving(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    """A one-token request whose client leaves while its only step runs: the engine core commits that
    step without it, and serves the next request (it used to lose its core while /health said 200)."""
    slow = ["--profile", "qwen3-235b-mi300x", "--time-scale", "0.1"]  # one prefill step lasts seconds
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), *slow])
    core = eng.engine.cores[0]
    body = {"prompt": [1] * 100, "max_tokens": 1, "ignore_eos": True}
    request = asyncio.create_task(call(http, eng.url, body))
    while not core.first_scheduled:
        await asyncio.sleep(0.01)
    request.cancel()  # the client goes away during the step that would finish the request
    await asyncio.gather(request, return_exceptions=True)
    while core.load:
        await asyncio.sleep(0.01)  # the engine saw the disconnect and aborted the request mid-step
    status, answer = await call(http, eng.url, body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 1
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 200
    assert core.dead is None


async def test_a_client_gone_before_the_first_output_aborts_its_request(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    """The client leaves while the response has not begun (here during the first-byte delay fault; in the
    live tier it fell in the head's write): the request is aborted as vLLM aborts it on disconnect, not
    left waiting for KV that will never come (a write-mode decode engine of 0.31 holds a plain request)."""
    eng = await start_engine([*consumer_argv("0.31.0", read=False), "--sim-first-byte-delay", "30"])
    core = eng.engine.cores[0]
    request = asyncio.create_task(call(http, eng.url, {**PLAIN, "stream": True}))
    while not core.load:
        await asyncio.sleep(0.01)
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    while core.load:
        await asyncio.sleep(0.01)  # before the fix: waiting for KV until the test's timeout


async def test_a_dead_engine_core_fails_its_requests_and_health(
    start_engine: EngineFactory, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's /health answers 503 on EngineDeadError; the requests in the core get a 500."""
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port())])

    def broken(step: Step) -> list[TokenEvent]:
        raise RuntimeError("simulated engine-core crash")

    monkeypatch.setattr(eng.engine.cores[0]._scheduler, "commit", broken)
    status, answer = await call(http, eng.url, {"prompt": "x", "max_tokens": 2})
    assert status == 500 and "engine core 0 died" in answer["error"]["message"]
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 503 and "simulated engine-core crash" in await resp.text()
    status, answer = await call(http, eng.url, {"prompt": "x", "max_tokens": 2})
    assert status == 500


async def test_greedy_token_ids_follow_from_the_prompt(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    """return_token_ids as vLLM 0.31 answers it; the ids depend on the prompt only, streamed or not."""
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port())])
    body = {"prompt": "Why is the sky blue?", "max_tokens": 5, "return_token_ids": True}
    _, first = await call(http, eng.url, body)
    _, again = await call(http, eng.url, body)
    _, other = await call(http, eng.url, {**body, "prompt": "Why is the sea blue?"})
    _, plain = await call(http, eng.url, {**body, "return_token_ids": False})
    ids = first["choices"][0]["token_ids"]
    assert len(ids) == 5 and ids == again["choices"][0]["token_ids"] != other["choices"][0]["token_ids"]
    assert "token_ids" not in plain["choices"][0] and plain["choices"][0]["text"] == first["choices"][0]["text"]
    async with http.post(eng.url + "/v1/completions", json={**body, "stream": True}) as resp:
        events = sse_events(await resp.text())
    assert [i for e in events for i in e["choices"][0]["token_ids"]] == ids


async def test_with_a_key_v1_needs_the_bearer_token_as_vllm_asks_and_health_stays_open(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "--api-key", "k1"])
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    assert (await call(http, eng.url, body))[0] == 401
    assert (await call(http, eng.url, body, headers={"Authorization": "Bearer k2"}))[0] == 401
    assert (await call(http, eng.url, body, headers={"Authorization": "Bearer k1"}))[0] == 200
    for path in ("/health", "/metrics"):
        async with http.get(eng.url + path) as resp:
            assert resp.status == 200, path
