"""Circuit breakers over real sockets: an engine that passes /health but never answers leaves the
rotation at its first timed-out leg, comes back only through a trial request after a heartbeat and a
good probe, and its clients are served by the other instance or get a clear error at once."""

from __future__ import annotations

import asyncio
from typing import Any

from pd_runtime.proxy.config import Timeouts
from tests.proxy.conftest import PdSetup, SetupFactory, second_instance
from tests.proxy.proxy_fakes import FakeEngine, wait_for
from tests.sim.sim_helpers import metric

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}
REQUESTS, CONCURRENCY = 40, 4


def circuit(setup: PdSetup, engine: FakeEngine) -> dict[str, Any]:
    return setup.proxy.registry.instances[engine.http_address].breaker.to_json()


async def metrics_text(setup: PdSetup) -> str:
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        return await resp.text()


async def clients(setup: PdSetup, count: int, concurrency: int) -> list[int]:
    """``count`` requests from ``concurrency`` clients that each send the next one when answered."""
    statuses: list[int] = []
    started = 0

    async def client() -> None:
        nonlocal started
        while started < count:
            started += 1
            statuses.append((await setup.post("/v1/completions", BODY))[0])

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return statuses


async def test_a_prefill_that_never_answers_gets_a_bounded_share_and_its_clients_are_served_elsewhere(
    pd_setup: SetupFactory,
) -> None:
    setup = await pd_setup(mode="READ", timeouts=Timeouts(prefill=0.5))
    setup.prefill.hang = True  # /health still answers 200
    healthy = await second_instance(setup, "P")
    statuses = await clients(setup, REQUESTS, CONCURRENCY)
    assert statuses == [200] * REQUESTS
    # at most one request per client reached it before its first leg timed out; none after that
    assert 1 <= len(setup.prefill.requests) <= CONCURRENCY
    assert len(healthy.requests) == REQUESTS
    sent = len(setup.prefill.requests)
    assert circuit(setup, setup.prefill) == {"state": "open", "reason": "timeout", "failures": sent}
    text = await metrics_text(setup)
    assert metric(text, "pd_proxy_circuit_opens_total", role="P", reason="timeout") == 1
    assert metric(text, "pd_proxy_instance_circuit_state", instance=setup.prefill.http_address) == 2
    assert metric(text, "pd_proxy_instance_circuit_state", instance=healthy.http_address) == 0
    async with setup.client.get(setup.admin_url + "/status") as resp:
        by_address = {inst["http_address"]: inst for inst in (await resp.json())["instances"]}
    assert by_address[setup.prefill.http_address]["healthy"] is False
    assert by_address[setup.prefill.http_address]["circuit"]["state"] == "open"

    # a heartbeat and a good probe: half-open, one trial request; it times out too and is served elsewhere
    await setup.beat_and_probe(setup.prefill)
    assert circuit(setup, setup.prefill)["state"] == "half_open"
    assert await clients(setup, 8, 2) == [200] * 8
    assert len(setup.prefill.requests) == sent + 1
    assert circuit(setup, setup.prefill)["reason"] == "trial"
    # it recovers: after two good probes (the failed trial doubled them) a trial that is answered
    setup.prefill.hang = False
    await setup.beat_and_probe(setup.prefill)
    await wait_for(lambda: circuit(setup, setup.prefill)["state"] == "half_open", what="half-open again")
    assert await clients(setup, 8, 1) == [200] * 8
    assert circuit(setup, setup.prefill) == {"state": "closed", "reason": None, "failures": 0}
    assert len(setup.prefill.requests) > sent + 1  # back in the rotation
    text = await metrics_text(setup)
    assert metric(text, "pd_proxy_circuit_opens_total", role="P", reason="trial") == 1


async def test_a_lone_prefill_that_never_answers_gives_a_clear_error_at_once_not_a_timeout_each(
    pd_setup: SetupFactory,
) -> None:
    """Write mode: decode's first byte waits for prefill's KV, so decode's first-byte timeout while prefill
    has not answered blames prefill, not decode."""
    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(prefill=30, first_byte=0.3))
    setup.prefill.hang = True
    setup.decode.first_chunk_delay = 30  # as a real decode engine waiting for KV that never comes
    status, body = await setup.stream(BODY)
    assert status == 502 and "prefill engine hung" in body
    assert circuit(setup, setup.prefill)["state"] == "open"
    assert circuit(setup, setup.decode) == {"state": "closed", "reason": None, "failures": 0}
    status, answer = await setup.post("/v1/completions", {**BODY, "stream": True})
    assert status == 503 and answer["error"]["code"] == "no_prefill_instance"
    assert len(setup.prefill.requests) == 1
