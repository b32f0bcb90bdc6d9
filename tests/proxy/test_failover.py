"""Failover across instances of a role: a failed engine before the first byte reaches the client is
retried once elsewhere, with a new transfer; after the first byte the client gets a clean error event.

Read mode, where the legs are serial: the fake engines do not model write mode's decode waiting for
prefill's KV (tests/sim/test_sim_xpyd.py kills real simulated engines in write mode)."""

from __future__ import annotations

import json

from tests.proxy.conftest import PdSetup, SetupFactory, second_instance
from tests.proxy.proxy_fakes import FakeEngine

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 8}


def transfer_ids(engine: FakeEngine) -> list[str]:
    return [r.body["kv_transfer_params"]["transfer_id"] for r in engine.requests]


def live(setup: PdSetup, engine: FakeEngine) -> bool:
    registry = setup.proxy.registry
    inst = registry.instances[engine.http_address]
    return registry.is_live(inst, 0.0 if inst.last_heartbeat is None else inst.last_heartbeat)


async def test_a_prefill_500_is_served_again_on_the_other_prefill_with_a_new_transfer(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.status = 500
    healthy = await second_instance(setup, "P")
    status, body = await setup.post("/v1/completions", BODY)
    assert status == 200, body
    (failed_id,), (served_id,) = transfer_ids(setup.prefill), transfer_ids(healthy)
    assert failed_id != served_id  # the transfer was planned again
    # decode got only the second attempt's leg, with its transfer
    (decoded,) = setup.decode.requests
    assert decoded.body["kv_transfer_params"]["transfer_id"] == served_id
    assert not live(setup, setup.prefill)
    for _ in range(4):  # out of rotation: every later request goes to the healthy one
        assert (await setup.post("/v1/completions", BODY))[0] == 200
    assert len(setup.prefill.requests) == 1 and len(healthy.requests) == 5
    failovers = setup.proxy.metrics.failovers.labels("prefill")._value.get()
    assert failovers == 1


async def test_a_failed_over_instance_returns_after_a_heartbeat_and_a_good_health_probe(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.status = 503
    await second_instance(setup, "P")
    assert (await setup.post("/v1/completions", BODY))[0] == 200
    housekeeping = setup.proxy.housekeeping
    assert housekeeping is not None
    await housekeeping.probe_all()  # /health answers 200 (the engine is up), but no heartbeat since
    assert not live(setup, setup.prefill)
    await setup.beat_and_probe(setup.prefill)
    assert live(setup, setup.prefill)  # half-open: the next request is its trial
    assert setup.proxy.registry.instances[setup.prefill.http_address].breaker.state == "half_open"


async def test_a_decode_connection_failure_is_served_on_the_other_decode(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    await setup.decode.stop()  # connection refused
    healthy = await second_instance(setup, "D")
    status, text = await setup.stream(BODY)
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    assert len(healthy.requests) == 1 and len(setup.prefill.requests) == 2  # both legs re-sent


async def test_no_failover_once_the_client_has_bytes(pd_setup: SetupFactory) -> None:
    """Without migration (tests/proxy/test_migration.py continues such a stream on the other decode)."""
    setup = await pd_setup(mode="READ", migration_limit=0)
    setup.decode.chunks, setup.decode.die_after = 10, 2
    other = await second_instance(setup, "D")
    status, text = await setup.stream(BODY)
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert status == 200 and len(events) == 4  # two tokens, the error event, [DONE]
    assert json.loads(events[2])["error"]["code"] == "decode_failed" and events[3] == "[DONE]"
    assert other.requests == []


async def test_a_refused_request_and_a_lone_instance_are_not_failed_over(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ")
    setup.prefill.status = 400  # the request's fault: another engine would refuse it too
    other = await second_instance(setup, "P")
    assert (await setup.post("/v1/completions", BODY))[0] == 400
    assert other.requests == [] and live(setup, setup.prefill)
    setup.decode.status = 500  # the only decode: nothing to fail over to, and it stays in rotation
    assert (await setup.post("/v1/completions", BODY))[0] == 502
    assert live(setup, setup.decode)
