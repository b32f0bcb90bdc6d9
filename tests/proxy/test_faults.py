"""Fault tests: failing engines, lost heartbeats, garbage frames, disconnecting clients."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable

import aiohttp
import msgpack
import pytest

from tests.proxy.conftest import SetupFactory, register_pair
from tests.proxy.proxy_fakes import Registrar, wait_for

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}


def _sse_events(text: str) -> list[str]:
    return [event.removeprefix("data: ") for event in text.split("\n\n") if event]


async def test_decode_killed_mid_stream_ends_with_an_error_event(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.decode.chunks, setup.decode.die_after = 10, 2
    status, text = await setup.stream(BODY)
    assert status == 200
    events = _sse_events(text)
    assert len(events) == 4  # two tokens, the error, [DONE]
    error = json.loads(events[2])["error"]
    assert error["type"] == "upstream_error" and error["code"] == "decode_failed"
    assert set(error) == {"message", "type", "param", "code"}
    assert events[3] == "[DONE]"
    assert setup.proxy.core.last_transfer is None


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("mode", ["READ", "WRITE"])
async def test_a_decode_stream_without_a_token_or_an_error_is_a_502(
    pd_setup: SetupFactory, mode: str, path: str
) -> None:
    """vLLM 0.31 fails a request whose KV load failed and streams only chat's role chunk, the usage chunk and
    [DONE] (relay.opens_answer): the client gets a 502, not HTTP 200 with an empty answer."""
    setup = await pd_setup(mode=mode)
    setup.decode.fail_before_token = True
    messages = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {}
    body = {**BODY, **messages, "stream": True, "stream_options": {"include_usage": True}}
    status, answer = await setup.post(path, body)
    assert status == 502, answer
    assert answer["error"]["type"] == "kv_transfer_error" and answer["error"]["code"] == "kv_load_failed"
    assert "without a token" in answer["error"]["message"]
    assert setup.proxy.metrics.upstream_errors.labels("decode", "no_output")._value.get() == 1
    assert setup.proxy.core.last_transfer is None
    setup.decode.fail_before_token = False  # the same engine's next stream is relayed whole
    status, text = await setup.stream(body, path)
    assert status == 200 and _sse_events(text)[-1] == "[DONE]" and '"t4"' in text


async def test_prefill_500_in_write_mode_cancels_decode_and_answers_502(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.prefill.status = 500
    setup.decode.hang = True  # D would wait for KV that never comes
    started = time.monotonic()
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    # Without the cancel the client would wait the whole kv wait (95 s by default): 30 s is slack for load.
    assert time.monotonic() - started < 30
    assert status == 502
    assert body["error"]["code"] == "prefill_failed"
    assert "engine failure" not in body["error"]["message"]  # the engine's 5xx text is not leaked
    await wait_for(lambda: setup.decode.requests[0].cancelled, what="decode leg closed")


async def test_prefill_failing_after_stream_began_gives_an_sse_error(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.prefill.status, setup.prefill.hang = 500, False
    setup.prefill.prefill_delay = 0.0
    setup.decode.chunks, setup.decode.chunk_interval = 200, 0.02
    gate = asyncio.Event()
    setup.prefill.prefill_gate = gate

    async def fail_prefill_after_tokens() -> None:
        await wait_for(lambda: "D:recv" in setup.events)
        await asyncio.sleep(0.2)
        gate.set()

    opener = asyncio.create_task(fail_prefill_after_tokens())
    status, text = await setup.stream(BODY)
    await opener
    assert status == 200
    events = _sse_events(text)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "prefill_failed"
    assert len(events) < 200
    await wait_for(lambda: setup.decode.requests[0].cancelled, what="decode leg closed")


async def test_prefill_4xx_passes_through_with_the_engine_body(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.status = 400
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 400
    assert body["error"]["message"] == "engine failure"
    assert setup.decode.requests == []


async def test_prefill_500_in_read_mode_never_reaches_decode(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.status = 500
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 502 and body["error"]["code"] == "prefill_failed"
    assert setup.decode.requests == []


@pytest.mark.parametrize("finish", ["abort", "stop"])
@pytest.mark.parametrize("mode", ["READ", "WRITE"])
async def test_unusable_prefill_is_served_on_prefill_as_a_plain_request(
    pd_setup: SetupFactory, mode: str, finish: str
) -> None:
    """No KV for decode, whatever prefill's finish reason (a stop can still happen under min_tokens: 1
    when a grammar allows only a stop token): never a plain request to decode, which vLLM 0.29 would hang."""
    setup = await pd_setup(mode=mode)
    setup.prefill.null_params, setup.prefill.null_params_finish = True, finish
    setup.decode.first_chunk_delay = 0.5
    status, text = await setup.stream(BODY)
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    kv_leg, plain = setup.prefill.requests
    assert "kv_transfer_params" in kv_leg.body and "kv_transfer_params" not in plain.body
    assert plain.body["max_tokens"] == 8 and plain.body["stream"] is True
    assert all("kv_transfer_params" in r.body and r.cancelled for r in setup.decode.requests)
    assert setup.proxy.core.last_transfer is None


async def test_unusable_prefill_can_be_an_error(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ", no_kv_fallback="error")
    setup.prefill.null_params, setup.prefill.null_params_finish = True, "abort"
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 502 and body["error"]["code"] == "prefill_no_kv"
    assert setup.decode.requests == [] and len(setup.prefill.requests) == 1


async def test_a_transfer_that_never_completes_is_aborted_after_the_kv_wait(pd_setup: SetupFactory) -> None:
    """Prefill answered, decode never gets its KV: the client gets a 504 once the kv wait (defer_timeout +
    transfer_timeout of the engines) has passed since prefill's answer, not after the first-byte timeout."""
    from pd_runtime.proxy.config import Timeouts

    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(first_byte=600, kv_wait=0.3))
    setup.decode.first_chunk_delay = 600
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    assert status == 502 and body["error"]["code"] == "kv_transfer_timeout"  # not the first-byte bound's 502
    assert body["error"]["type"] == "kv_transfer_error"
    await wait_for(lambda: setup.decode.requests[0].cancelled, what="decode leg aborted")
    errors = setup.proxy.metrics.upstream_errors.labels("decode", "kv_timeout")._value.get()
    assert errors == 1


async def test_a_request_not_streamed_is_bounded_by_the_kv_wait_too(pd_setup: SetupFactory) -> None:
    """Its decode leg is streamed (legs.streams_whole), so the kv wait, not the 1800 s response timeout,
    ends a wait for KV that never comes; the same engine's answer is assembled whole once it comes."""
    from pd_runtime.proxy.config import Timeouts

    setup = await pd_setup(mode="READ", timeouts=Timeouts(response=600, kv_wait=0.3))
    setup.decode.first_chunk_delay = 600
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 502 and body["error"]["code"] == "kv_transfer_timeout"  # not the deadline's 504
    await wait_for(lambda: setup.decode.requests[0].cancelled, what="decode leg aborted")
    assert setup.decode.requests[0].body["stream"] is True
    setup.decode.first_chunk_delay = 0
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 200 and body["choices"][0]["text"] == "t0t1t2t3t4", body


async def test_decode_engines_get_at_most_their_limit_in_flight(pd_setup: SetupFactory) -> None:
    """One request per decode rank (its max_num_seqs), one more waits in the proxy before either leg starts,
    the next gets 429 + Retry-After (overloaded)."""
    setup = await pd_setup(mode="WRITE", decode_max_in_flight=1)
    setup.decode.first_chunk_delay = 0.5
    first = asyncio.create_task(setup.stream(BODY))
    await wait_for(lambda: len(setup.decode.requests) == 1, what="first request at decode")
    queued = asyncio.create_task(setup.stream(BODY))
    await wait_for(lambda: setup.proxy.core.decode_queue == 1, what="second request queued")
    assert len(setup.prefill.requests) == 1, "a queued request starts no leg"
    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == "decode_at_capacity"
    assert (await first)[0] == 200 and (await queued)[0] == 200
    assert max(r.received for r in setup.decode.requests[1:]) >= setup.decode.requests[0].answered  # type: ignore[operator]


async def test_decode_500_before_first_byte_cancels_prefill(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.decode.status = 500
    setup.prefill.hang = True
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 502 and body["error"]["code"] == "decode_failed"
    await wait_for(lambda: bool(setup.prefill.requests) and setup.prefill.requests[0].cancelled, what="P closed")


async def test_first_byte_and_idle_timeouts(pd_setup: SetupFactory) -> None:
    from pd_runtime.proxy.config import Timeouts

    # Each timeout is short against an engine that is far slower (10 s), and the other one stays at its
    # default, so a slow machine cannot make the healthy part of a stream time out.
    setup = await pd_setup(mode="READ", timeouts=Timeouts(first_byte=0.3))
    setup.decode.first_chunk_delay = 10
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    assert status == 502 and body["error"]["code"] == "decode_failed" and "hung" in body["error"]["message"]
    # the only decode timed out: its circuit is open, the next request gets a 503 at once
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    assert status == 503 and body["error"]["code"] == "no_decode_instance"
    await setup.beat_and_probe(setup.decode)  # half-open: the next request is the trial

    idle = await pd_setup(mode="READ", timeouts=Timeouts(idle=0.3))
    idle.decode.chunk_interval, idle.decode.chunks = 10, 5
    status, text = await idle.stream(BODY)
    events = _sse_events(text)
    assert status == 200 and json.loads(events[-2])["error"]["code"] == "decode_failed"


async def test_no_live_prefill_or_decode_gets_503_at_once(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False)
    started = time.monotonic()
    status, body = await setup.post("/v1/completions", BODY)
    assert time.monotonic() - started < 30  # not held until an engine registers (the client's own timeout)
    assert status == 503
    assert body["error"]["code"] == "no_prefill_instance"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    await setup.registrar.send(setup.prefill.g2_registration())
    # Routable once its /health probe passed, not as soon as it is registered.
    await wait_for(lambda: setup.proxy.registry.live("P", time.monotonic()), timeout=30, what="prefill routable")
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 503 and body["error"]["code"] == "no_decode_instance"


async def test_admission_limit_sheds_load_with_retry_after(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", max_in_flight=1)
    setup.decode.chunks, setup.decode.chunk_interval = 20, 0.05
    first = asyncio.create_task(setup.stream(BODY))
    await wait_for(lambda: setup.proxy.core.in_flight == 1, what="first request in flight")
    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"  # no request finished yet: 1 s
        assert json.loads(await resp.read())["error"]["code"] == "rate_limit_exceeded"
    assert (await first)[0] == 200


async def test_heartbeats_stop_then_evicted_within_the_ttl(pd_setup: SetupFactory) -> None:
    """How soon after the TTL an instance goes is tested in virtual time (test_core); here: it does go."""
    ttl = 2.0
    setup = await pd_setup(mode="WRITE", heartbeat_ttl_s=ttl)
    # Beats keep it alive past the TTL (a beat 10 times per TTL: a stalled test loop does not evict it).
    for _ in range(12):
        await setup.registrar.send(setup.prefill.g2_registration())
        await setup.registrar.send(setup.decode.g2_registration())
        await asyncio.sleep(ttl / 10)
    assert setup.proxy.not_ready_reason() == ""
    await wait_for(lambda: not setup.proxy.registry.instances, timeout=60, what="eviction")
    status, _body = await setup.post("/v1/completions", BODY)
    assert status == 503
    async with setup.client.get(setup.url + "/ready") as resp:
        assert resp.status == 503


async def test_rendered_engines_outlive_their_heartbeats_while_health_answers(pd_setup: SetupFactory) -> None:
    """Told its engines, the proxy keeps one whose beats stop (a flood delays them) while its /health
    answers; one whose /health fails too is evicted after the TTL, as before."""
    ttl = 1.0
    setup = await pd_setup(mode="WRITE", heartbeat_ttl_s=ttl, expect=True)
    prefill = setup.proxy.registry.instances[setup.prefill.http_address]
    await wait_for(lambda: (prefill.heartbeat_age(time.monotonic()) or 0) > 3 * ttl, what="the beats long stale")
    assert setup.proxy.not_ready_reason() == "" and setup.proxy.metrics.evictions.labels("P")._value.get() == 0
    status, _body = await setup.post("/v1/completions", BODY)
    assert status == 200
    await setup.decode.stop()
    await wait_for(lambda: setup.decode.http_address not in setup.proxy.registry.instances, what="decode evicted")
    assert list(setup.proxy.registry.instances) == [setup.prefill.http_address]


async def test_failed_health_checks_take_an_instance_out_of_rotation(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE", heartbeat_ttl_s=60)
    await setup.decode.stop()  # registered, heartbeat fresh, but dead
    await wait_for(lambda: setup.proxy.not_ready_reason() == "no live decode instance", what="health failure")
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 503 and body["error"]["code"] == "no_decode_instance"


async def test_a_thousand_garbage_frames_are_counted_and_never_fatal(pd_setup: SetupFactory) -> None:
    """Five kinds of garbage, each from a connection of its own: each connection is dropped at its first
    frame (its DEALER reconnects and sends more), the listener lives, valid registrations then get in."""
    setup = await pd_setup(register=False)
    kinds: list[Callable[[int], list[bytes]]] = [
        lambda i: [os.urandom(1 + i % 64)],
        lambda i: [msgpack.packb([1, 2, i])],
        lambda i: [msgpack.packb({"type": "P", "http_address": i})],
        lambda i: [msgpack.packb({"type": "register", "role": "X", "request_address": "ftp://x"})],
        lambda i: [b"a", b"b"],  # a multi-part message: not one frame
    ]
    senders = [Registrar(setup.proxy.config.registration_address) for _ in kinds]
    try:
        for i in range(1000):
            await senders[i % 5].send_raw(kinds[i % 5](i))
        metrics = setup.proxy.metrics
        dropped = metrics.registration_peers_dropped.labels("refused_frame")
        await wait_for(lambda: dropped._value.get() >= 5, what="every garbage connection dropped")
    finally:
        for sender in senders:
            sender.close()
    assert metrics.registration_frames.labels("malformed")._value.get() >= 5
    assert setup.proxy.listener._task is not None and not setup.proxy.listener._task.done()
    await setup.registrar.send(setup.prefill.g2_registration())
    await setup.registrar.send(setup.decode.g1_registration())
    await wait_for(lambda: not setup.proxy.not_ready_reason(), what="valid registrations after garbage")
    status, _ = await setup.post("/v1/completions", BODY)
    assert status == 200


async def test_conflicting_transfer_mode_is_refused_without_poisoning_others(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False, transfer_mode="auto")
    await setup.registrar.send(setup.decode.g2_registration("WRITE"))
    # Each engine has its own connection, so frames from two engines race: decode's must land first to pick WRITE.
    await wait_for(lambda: setup.decode.http_address in setup.proxy.registry.instances, what="decode registered")
    await setup.registrar.send(setup.prefill.g2_registration("READ"))
    await setup.registrar.send(setup.prefill.g2_registration("READ"))
    frames = setup.proxy.metrics.registration_frames
    await wait_for(lambda: frames.labels("refused_mismatch")._value.get() >= 1, what="refusals")
    assert list(setup.proxy.registry.instances) == [setup.decode.http_address]
    assert setup.proxy.registry.transfer_mode == "WRITE"
    await setup.registrar.send(setup.prefill.g2_registration("WRITE"))
    await wait_for(lambda: not setup.proxy.not_ready_reason(), what="matching prefill")


async def test_client_disconnect_closes_both_upstream_requests(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.prefill.hang = True
    setup.decode.chunks, setup.decode.chunk_interval = 1000, 0.05
    async with aiohttp.ClientSession() as client:
        resp = await client.post(setup.url + "/v1/completions", json={**BODY, "stream": True})
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")
        resp.close()  # the client goes away mid-stream
    await wait_for(
        lambda: setup.decode.requests[0].cancelled and setup.prefill.requests[0].cancelled,
        what="both legs closed",
    )
    await wait_for(lambda: setup.proxy.core.in_flight == 0, what="request finished")


async def test_client_disconnect_while_waiting_for_prefill_in_read_mode(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.hang = True
    async with aiohttp.ClientSession() as client:
        task = asyncio.create_task(client.post(setup.url + "/v1/completions", json=BODY))
        await wait_for(lambda: bool(setup.prefill.requests), what="prefill leg")
        task.cancel()
    await wait_for(lambda: setup.prefill.requests[0].cancelled, what="prefill closed")
    assert setup.decode.requests == []


async def test_the_decode_limit_holds_per_rank_when_both_legs_share_the_rank(pd_setup: SetupFactory) -> None:
    """Equal DP sizes pin both legs to one rank; that rank is the decode rank chosen below its limit."""
    setup = await pd_setup(register=False, decode_max_in_flight=1)
    setup.prefill.dp_size = setup.decode.dp_size = 2
    setup.decode.first_chunk_delay = 0.5
    await register_pair(setup, "WRITE", "G2")
    streams = [asyncio.create_task(setup.stream(BODY)) for _ in range(2)]
    await wait_for(lambda: len(setup.decode.requests) == 2, what="both requests at decode")
    assert sorted(r.headers["X-data-parallel-rank"] for r in setup.decode.requests) == ["0", "1"]
    await wait_for(lambda: len(setup.prefill.requests) == 2, what="both requests at prefill")
    rank_of = {
        r.body["kv_transfer_params"]["transfer_id"]: r.headers["X-data-parallel-rank"] for r in setup.prefill.requests
    }
    for d_req in setup.decode.requests:
        assert rank_of[d_req.body["kv_transfer_params"]["transfer_id"]] == d_req.headers["X-data-parallel-rank"]
    assert [status for status, _ in await asyncio.gather(*streams)] == [200, 200]
