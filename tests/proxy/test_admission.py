"""Admission: --max-in-flight, the bounded FIFO queue behind it, and 429 + Retry-After past it.

The decisions (``Admission``) without I/O; the asyncio shell (``AdmissionGate``) with real tasks; then a
real proxy over real HTTP: a full queue answers 429 with Retry-After, queued requests are served in
arrival order once a slot frees, and a client that leaves while queued leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from pd_runtime.proxy.admission import RETRY_AFTER_MAX_S, Admission
from pd_runtime.proxy.admission_gate import AdmissionGate
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.errors import ApiError, unavailable
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Registry
from tests.proxy.conftest import SetupFactory
from tests.proxy.proxy_fakes import wait_for

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}

# ---- the pure core ------------------------------------------------------------------------------


def test_admits_up_to_the_limit_then_queues_then_refuses() -> None:
    state = Admission(limit=2, max_queued=2)
    assert [state.arrive(t) for t in range(1, 6)] == ["admitted", "admitted", "queued", "queued", "full"]
    assert (state.in_flight, state.queued) == (2, 2)


def test_a_freed_slot_goes_to_the_head_of_the_queue_not_to_a_newcomer() -> None:
    state = Admission(limit=1, max_queued=3)
    state.arrive(1)
    state.arrive(2)
    state.arrive(3)
    assert state.release(1.0) == [2]
    assert state.arrive(4) == "queued"  # a slot is free only for the queue's head: no barging
    assert state.release(1.0) == [3]
    assert state.release(1.0) == [4]
    assert state.release(1.0) == [] and (state.in_flight, state.queued) == (0, 0)


def test_no_limit_admits_everyone_and_queues_nothing() -> None:
    state = Admission()
    assert all(state.arrive(t) == "admitted" for t in range(100))
    assert state.queued == 0 and state.retry_after() == 1


def test_no_queue_refuses_at_once_past_the_limit() -> None:
    state = Admission(limit=1, max_queued=0)
    assert [state.arrive(1), state.arrive(2)] == ["admitted", "full"]


def test_leaving_the_queue_and_a_ticket_admitted_meanwhile() -> None:
    state = Admission(limit=1, max_queued=2)
    state.arrive(1)
    state.arrive(2)
    state.arrive(3)
    assert state.leave(2) is True and state.queued == 1
    assert state.release(1.0) == [3]
    assert state.leave(3) is False  # admitted: it holds a slot now
    assert state.in_flight == 1


def test_reconfigure_a_higher_limit_admits_waiting_tickets_a_smaller_queue_keeps_them() -> None:
    state = Admission(limit=1, max_queued=3)
    for ticket in range(1, 5):
        state.arrive(ticket)
    assert state.reconfigure(limit=1, max_queued=1) == [] and state.queued == 3
    assert state.arrive(5) == "full"
    assert state.reconfigure(limit=3, max_queued=1) == [2, 3]
    assert state.reconfigure(limit=0, max_queued=0) == [4]  # no limit: everyone in
    assert (state.in_flight, state.queued) == (4, 0)


def test_retry_after_is_the_queue_ahead_served_at_the_measured_rate() -> None:
    state = Admission(limit=2, max_queued=3)
    for ticket in range(1, 6):
        state.arrive(ticket)
    assert state.retry_after() == 1  # nothing finished yet: no rate known
    state.release(10.0)  # slots held 10 s: 2 slots free one every 5 s
    state.arrive(6)  # back to 3 queued
    assert state.queued == 3
    assert state.retry_after() == 20  # (3 queued + itself) * 10 s / 2 slots
    state.release(0.01)  # the average moves a fifth of the way (8.002 s); the head of the queue got the slot
    assert state.service_s == pytest.approx(8.002) and state.queued == 2
    assert state.retry_after() == 13  # ceil((2 + 1) * 8.002 / 2)


def test_retry_after_is_at_least_one_and_at_most_a_minute() -> None:
    fast = Admission(limit=64, max_queued=0)
    fast.arrive(1)
    fast.release(0.001)
    assert fast.retry_after() == 1
    slow = Admission(limit=1, max_queued=100)
    for ticket in range(102):
        slow.arrive(ticket)
    slow.release(600.0)
    assert slow.retry_after() == RETRY_AFTER_MAX_S


# ---- the asyncio shell --------------------------------------------------------------------------


def _gate(limit: int, max_queued: int, timeout_s: float = 30.0) -> tuple[AdmissionGate, ProxyMetrics]:
    metrics = ProxyMetrics(Registry("disaggregated", "auto", None, []))
    loop = asyncio.get_running_loop()
    return AdmissionGate(limit, max_queued, timeout_s, metrics, loop.time), metrics


async def _hold(gate: AdmissionGate, release: asyncio.Event, served: list[str], name: str) -> None:
    async with gate.admitted(Deadline.after(asyncio.get_running_loop().time(), 600)):
        served.append(name)
        await release.wait()


def _sample(metrics: ProxyMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels or {})
    return value


async def test_a_slot_reaching_a_client_that_just_left_goes_on_to_the_next() -> None:
    gate, metrics = _gate(limit=1, max_queued=2)
    done, served = asyncio.Event(), []
    first = asyncio.create_task(_hold(gate, done, served, "first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(_hold(gate, asyncio.Event(), served, "second"))
    third = asyncio.create_task(_hold(gate, asyncio.Event(), served, "third"))
    await asyncio.sleep(0)
    assert gate.state.queued == 2 and _sample(metrics, "pd_proxy_admission_queue") == 2
    done.set()
    await asyncio.sleep(0)  # "first" ran and released: the slot was handed to "second"...
    assert first.done() and gate.state.queued == 1 and not second.done()
    second.cancel()  # ...whose client leaves before it ran
    with pytest.raises(asyncio.CancelledError):
        await second
    await asyncio.sleep(0)
    assert served == ["first", "third"]
    assert gate.state.to_json() | {"service_s": None} == {
        "max_in_flight": 1,
        "max_queued": 2,
        "in_flight": 1,
        "queued": 0,
        "service_s": None,
    }
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)
    assert (gate.state.in_flight, gate.state.queued) == (0, 0)
    assert _sample(metrics, "pd_proxy_admission_queue") == 0


async def test_a_wait_past_the_queue_timeout_is_refused_with_429() -> None:
    gate, metrics = _gate(limit=1, max_queued=1, timeout_s=0.05)
    done = asyncio.Event()
    first = asyncio.create_task(_hold(gate, done, [], "first"))
    await asyncio.sleep(0)
    with pytest.raises(ApiError) as refused:
        async with gate.admitted(Deadline.after(asyncio.get_running_loop().time(), 600)):
            raise AssertionError("admitted past a held slot")
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert "waited 0.05 s in the queue" in refused.value.message
    assert _sample(metrics, "pd_proxy_admission_rejections_total", {"reason": "queue_timeout"}) == 1
    assert gate.state.queued == 0
    done.set()
    await first


async def test_a_reload_raising_the_limit_admits_the_queue_and_a_drain_answers_503() -> None:
    gate, _ = _gate(limit=1, max_queued=3)
    release, served = asyncio.Event(), []
    tasks = [asyncio.create_task(_hold(gate, release, served, str(n))) for n in range(4)]
    await asyncio.sleep(0)
    assert gate.state.queued == 3
    gate.reconfigure(limit=2, max_queued=3, timeout_s=30.0)
    await asyncio.sleep(0)
    assert served == ["0", "1"] and gate.state.queued == 2
    gate.drain(unavailable("the proxy is shutting down", "shutting_down"))
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[:2] == [None, None]
    assert all(isinstance(r, ApiError) and r.status == 503 for r in results[2:])
    assert (gate.state.in_flight, gate.state.queued) == (0, 0)


# ---- a real proxy over real HTTP ----------------------------------------------------------------


async def _metrics_text(setup: Any) -> str:
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        return str(await resp.text())


async def test_a_full_queue_answers_429_with_retry_after_and_queued_requests_go_in_order(
    pd_setup: SetupFactory,
) -> None:
    setup = await pd_setup(mode="READ", max_in_flight=1, max_queued=2)
    gate = asyncio.Event()
    setup.prefill.prefill_gate = gate  # prefill answers once the test opens it; read mode sends decode after it
    first = asyncio.create_task(setup.post("/v1/completions", {**BODY, "prompt": "r1"}))
    await wait_for(lambda: setup.proxy.admission.state.in_flight == 1, what="the first request admitted")
    second = asyncio.create_task(setup.post("/v1/completions", {**BODY, "prompt": "r2"}))
    await wait_for(lambda: setup.proxy.admission.state.queued == 1, what="the second request queued")
    third = asyncio.create_task(setup.post("/v1/completions", {**BODY, "prompt": "r3"}))
    await wait_for(lambda: setup.proxy.admission.state.queued == 2, what="the third request queued")

    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        assert resp.status == 429
        assert int(resp.headers["Retry-After"]) >= 1
        error = json.loads(await resp.read())["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert "queue of 2 is full" in error["message"] and set(error) == {"message", "type", "param", "code"}
    async with setup.client.get(setup.admin_url + "/status") as resp:
        status = await resp.json()
    assert status["admission"]["queued"] == 2 and status["demand"]["queued"] == 2
    assert status["demand"]["arrivals"] == 4  # the refused request is demand too
    text = await _metrics_text(setup)
    assert "pd_proxy_admission_queue 2.0" in text
    assert 'pd_proxy_admission_rejections_total{reason="queue_full"} 1.0' in text

    gate.set()
    answers = await asyncio.gather(first, second, third)
    assert [status for status, _ in answers] == [200, 200, 200]
    assert [r.body["prompt"] for r in setup.decode.requests] == ["r1", "r2", "r3"]  # arrival order
    assert (setup.proxy.admission.state.in_flight, setup.proxy.admission.state.queued) == (0, 0)
    text = await _metrics_text(setup)
    assert 'pd_proxy_requests_total{endpoint="completions",outcome="rate_limited"} 1.0' in text
    assert "pd_proxy_admission_wait_seconds_count 2.0" in text


async def test_a_client_that_leaves_while_queued_leaves_nothing_behind(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ", max_in_flight=1, max_queued=1)
    gate = asyncio.Event()
    setup.prefill.prefill_gate = gate
    first = asyncio.create_task(setup.post("/v1/completions", {**BODY, "prompt": "r1"}))
    await wait_for(lambda: setup.proxy.admission.state.in_flight == 1, what="the first request admitted")
    body = json.dumps({**BODY, "prompt": "gone"}).encode()
    with socket.create_connection(("127.0.0.1", setup.proxy.api_port)) as client:
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await wait_for(lambda: setup.proxy.admission.state.queued == 1, what="the second request queued")
    # the client closed its connection: the server notices (docs/proxy.md, "A client that half-closes")
    await wait_for(lambda: setup.proxy.admission.state.queued == 0, timeout=30, what="the queue emptied")
    gate.set()
    assert (await first)[0] == 200
    assert (await setup.post("/v1/completions", {**BODY, "prompt": "r3"}))[0] == 200
    assert [r.body["prompt"] for r in setup.prefill.requests] == ["r1", "r3"]  # the gone one reached no engine
    assert setup.proxy.admission.state.to_json()["in_flight"] == 0
    assert setup.proxy.core.in_flight == 0
    text = await _metrics_text(setup)
    assert "pd_proxy_admission_queue 0.0" in text
    assert 'pd_proxy_requests_total{endpoint="completions",outcome="cancelled"} 1.0' in text
    assert _sample(setup.proxy.metrics, "pd_proxy_admission_rejections_total", {"reason": "queue_full"}) is None
