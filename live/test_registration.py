"""The proxy's view of the engines comes from vLLM itself: registrations are vLLM's own MoRIIOConnector
heartbeats (``proxy_ip``/``proxy_ping_port`` of the rendered kv-transfer config)."""

from __future__ import annotations

import time
from typing import Any

from live.cluster import Engine, Pair

WAIT_S = 120.0


def _instance(pair: Pair, engine: Engine) -> dict[str, Any]:
    address = engine.url.removeprefix("http://")
    (inst,) = [i for i in pair.status()["instances"] if i["http_address"] == address]
    return inst


def test_registrations_are_vllms_heartbeats(pair: Pair) -> None:
    for engine, role in ((pair.prefill, "P"), (pair.decode, "D")):
        inst = _instance(pair, engine)
        assert (inst["role"], inst["transfer_mode"], inst["generation"]) == (role, pair.mode.upper(), "G2")
        assert inst["healthy"]
        assert inst["zmq_address"].startswith("host:127.0.0.1,handshake:")
        # A later beat arrives: the age falls again (bounded generously; a loaded machine delays beats).
        first = inst["heartbeat_age_s"]
        deadline = time.monotonic() + WAIT_S
        while (age := _instance(pair, engine)["heartbeat_age_s"]) >= first or age is None:
            assert time.monotonic() < deadline, f"no heartbeat from {role} in {WAIT_S:.0f} s"
            first = max(first, age or 0)
            time.sleep(0.5)
