"""The proxy's KV canary on real vLLM engines: True with intact KV, a mismatch when the stand-in corrupts it.

The canary (pd_runtime.proxy.canary) runs in this process against the pair's engines: its own ProxyCore
with the engines registered from the pair's proxy /status (the engines heartbeat to that proxy only), so
the legs, the reference request and the comparison are exactly the proxy's. With the ``mori.io`` stand-in
storing corrupted bytes (``faults.set("corrupt")``) the transfer completes, decode answers HTTP 200, and
its greedy token ids differ from the prefill engine's own: the canary must say so, with the position.
"""

from __future__ import annotations

import asyncio
import time

from live.cluster import Faults, Pair, wait_idle
from pd_runtime.protocol import registration_from_map
from pd_runtime.proxy.canary import Canary
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.flows import ProxyCore
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Registry
from pd_runtime.proxy.routing import Router
from pd_runtime.proxy.status import CanaryState

PROMPT = "def format_help(self):\n    "


async def _canary_runs(pair: Pair, faults: Faults) -> tuple[CanaryState, CanaryState]:
    """One canary run with the KV intact, then one with the stand-in corrupting it."""
    config = ProxyConfig(transfer_mode=pair.mode, canary_interval_s=3600, canary_prompt=PROMPT)  # type: ignore[arg-type]
    registry = Registry(config.mode, config.transfer_mode, None, [])
    now = time.monotonic()
    for inst in pair.status()["instances"]:
        keys = ("http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode")
        registry.observe(registration_from_map({"type": inst["role"], **{k: inst[k] for k in keys}}), now)
        registry.record_health(inst["http_address"], True, now)
    core = ProxyCore(config, registry, Router(config.policy), ProxyMetrics(registry))
    await core.start()
    try:
        canary = Canary(core, config)
        intact = await canary.run_once()
        faults.set("corrupt")
        corrupted = await canary.run_once()
    finally:
        await core.close()
    return intact, corrupted


def test_the_canary_sees_corrupted_kv(pair: Pair, faults: Faults) -> None:
    transfers = len(faults.transfers())
    intact, corrupted = asyncio.run(_canary_runs(pair, faults))
    assert (intact.ok, intact.kv_match, intact.error) == (True, True, None)
    assert corrupted.ok is False and corrupted.kv_match is False
    mismatch = corrupted.kv_mismatch
    assert mismatch is not None and mismatch["compared"] == 8
    assert mismatch["expected"] != mismatch["got"] and 0 <= mismatch["position"] < 8
    assert [t["fault"] for t in faults.transfers()[transfers:]][-1] == "corrupt"
    wait_idle(pair)
