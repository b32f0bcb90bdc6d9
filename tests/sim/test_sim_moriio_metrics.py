"""vLLM main's ``vllm:moriio_*`` transfer metrics through real processes (`pdctl proxy` + simulated
engines): an engine started with ``--sim-moriio-metrics`` exports them, as vLLM's main branch; one without
does not, as every release; the proxy's /status shows the first's under vLLM's names and nothing for the
second. The engine that moves the KV counts the transfers (write mode prefill, read mode decode).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pd_runtime.sim.profiles import QWEN3_235B_MI300X as PROFILE
from pd_runtime.sim.stack import LocalStack, launch
from pd_runtime.sim.system import EngineShape, Topology
from tests.sim.sim_helpers import metric, scrape

pytestmark = pytest.mark.timeout(120)
SHAPE = EngineShape(tp=1, max_batched_tokens=4096, max_num_seqs=8)
TIME_SCALE = 30.0
KV_WAIT_S = 60 / TIME_SCALE + 1  # past the connector's default defer_timeout (60 model seconds)
BODY = {"model": "sim-model", "prompt": [11, 12, 13, 14, 15], "max_tokens": 4}


async def _status(session: aiohttp.ClientSession, stack: LocalStack) -> dict[str, Any]:
    async with session.get(stack.admin_url + "/status") as resp:
        doc: dict[str, Any] = await resp.json()
        return doc


async def _post(session: aiohttp.ClientSession, stack: LocalStack) -> int:
    async with session.post(stack.proxy_url + "/v1/completions", json=BODY) as resp:
        await resp.read()
        return resp.status


async def _instances_once_scraped(
    session: aiohttp.ClientSession, stack: LocalStack, role: str, counter: str
) -> dict[str, Any]:
    """/status's instances by role once a scrape (every 0.2 s) shows ``counter`` of the ``role`` engine above 0."""
    for _ in range(100):
        by_role = {inst["role"]: inst for inst in (await _status(session, stack))["instances"]}
        if (by_role[role]["moriio_metrics"] or {}).get(counter):
            return by_role
        await asyncio.sleep(0.1)
    raise AssertionError(f"{role}'s {counter} never showed in /status: {by_role}")


def _stack(stacks: list[LocalStack], path: Path, kind: str, role_args: dict[str, tuple[str, ...]]) -> LocalStack:
    stack = launch(
        Topology(kind, prefill=SHAPE, decode=SHAPE),
        PROFILE.name,
        TIME_SCALE,
        path,
        extra_proxy_args=("--load-interval", "0.2", "--kv-wait-timeout", str(KV_WAIT_S)),
        role_args=role_args,
    )
    stacks.append(stack)
    return stack


async def test_status_shows_the_engines_own_transfer_metrics_where_they_export_them(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    faults = tmp_path / "kv-fault.json"
    faults.write_text("{}")
    stack = _stack(stacks, tmp_path, "write", {"prefill": ("--sim-moriio-metrics", "--sim-kv-fault-file", str(faults))})
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        served = [await _post(session, stack) for _ in range(2)]
        faults.write_text(json.dumps({"fault": "fail"}))
        failed = await _post(session, stack)
        by_role = await _instances_once_scraped(session, stack, "P", "vllm:moriio_num_failed_transfers")
        proxy = await scrape(session, stack.admin_url)
    assert served == [200, 200] and failed == 502
    moriio = by_role["P"]["moriio_metrics"]
    xfer = moriio.pop("vllm:moriio_xfer_time_seconds")
    assert xfer["count"] == 2 and xfer["sum"] > 0
    assert moriio == {
        "vllm:moriio_num_failed_transfers": 1.0,
        "vllm:moriio_num_failed_notifications": 0.0,
        "vllm:moriio_num_kv_expired_reqs": 0.0,
        "vllm:moriio_post_time_seconds": {"count": 2.0, "sum": 0.0},
        "vllm:moriio_bytes_transferred": {"count": 2.0, "sum": 2.0 * len(BODY["prompt"]) * PROFILE.kv_bytes_per_token},
        "vllm:moriio_num_descriptors": {"count": 2.0, "sum": 2.0},  # one 16-token block each
    }
    assert by_role["D"]["moriio_metrics"] is None  # a release's engine: nothing made up
    assert metric(proxy, "pd_proxy_upstream_errors_total", leg="decode", kind="kv_timeout") == 1  # ours stay


async def test_in_read_mode_decode_counts_the_reads_and_prefill_the_kv_that_expired(
    stacks: list[LocalStack], tmp_path: Path
) -> None:
    """Decode reads, so a read the fault switch fails counts there (and still releases prefill's blocks, as
    vLLM's ``_pop_done_transfers`` does); prefill, never told to release the blocks of a read that never
    ends, reaps them after ``defer_timeout`` and counts expired KV (vLLM: "tracked on the P instance")."""
    faults = tmp_path / "kv-fault.json"
    faults.write_text("{}")
    flag = ("--sim-moriio-metrics",)
    stack = _stack(stacks, tmp_path, "read", {"prefill": flag, "decode": (*flag, "--sim-kv-fault-file", str(faults))})
    await stack.wait_ready(timeout_s=60)
    async with aiohttp.ClientSession() as session:
        served = await _post(session, stack)
        faults.write_text(json.dumps({"fault": "fail"}))
        failed = await _post(session, stack)
        faults.write_text(json.dumps({"fault": "drop"}))
        dropped = await _post(session, stack)
        by_role = await _instances_once_scraped(session, stack, "P", "vllm:moriio_num_kv_expired_reqs")
    assert (served, failed, dropped) == (200, 502, 502)
    prefill, decode = by_role["P"]["moriio_metrics"], by_role["D"]["moriio_metrics"]
    assert decode["vllm:moriio_xfer_time_seconds"]["count"] == 1
    assert decode["vllm:moriio_num_failed_transfers"] == 1
    assert prefill["vllm:moriio_xfer_time_seconds"]["count"] == 0
    assert (prefill["vllm:moriio_num_kv_expired_reqs"], prefill["vllm:moriio_num_failed_transfers"]) == (1, 0)
