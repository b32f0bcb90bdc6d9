"""Registration floods against a real proxy: thousands of connections, and peers pushing oversized frames.

The bounds these tests hold are stated in docs/security.md#registration-bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import zmq

from tests.ports import TEST_PORTS
from tests.proxy.conftest import SetupFactory
from tests.proxy.proxy_fakes import Registrar

REPO = Path(__file__).resolve().parents[2]
FLOOD_CONNECTIONS = 16_000
FRAMES_EACH = 3
HOLD_S = 3.0  # the flood's connections stay open this long after the last one is made
BEAT_S = 1.0  # the engines' heartbeat interval here (vLLM's is 3 s)
TTL_S = 10.0
REQUESTS = 4
BIG_FRAME_PEERS = 4
BIG_FRAME_BYTES = 60_000
PUSH_S = 3.0
RSS_BUDGET_BYTES = 8 * 2**20  # what 4 peers pushing 60 kB frames may add to the proxy's RSS


async def _beat(address: str, payload: dict[str, object], stop: asyncio.Event) -> None:
    """One engine's heartbeat loop on a DEALER of its own, as vLLM's ``_ping`` runs it."""
    registrar = Registrar(address)
    try:
        while not stop.is_set():
            await registrar.send(payload)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), BEAT_S)
    finally:
        registrar.close()


def _flood_processes(connections: int) -> int:
    """Enough processes that none holds more sockets than its descriptor limit (raised to the hard one)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_process = connections if hard == resource.RLIM_INFINITY else max(1, hard - 256)
    return -(-connections // per_process)


async def test_a_flood_of_16000_connections_leaves_both_engines_fresh_registered_and_routable(
    pd_setup: SetupFactory, tmp_path: Path
) -> None:
    setup = await pd_setup(expect=True, heartbeat_ttl_s=TTL_S)
    address = setup.proxy.config.registration_address
    stop = asyncio.Event()
    beats = [asyncio.create_task(_beat(address, e.g2_registration(), stop)) for e in (setup.prefill, setup.decode)]
    target = urlsplit(address)
    processes = _flood_processes(FLOOD_CONNECTIONS)
    outs = [tmp_path / f"flood-{i}.json" for i in range(processes)]
    flood_args = [str(target.hostname), str(target.port), str(FLOOD_CONNECTIONS // processes), str(FRAMES_EACH)]
    floods = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.proxy.registration_flood", *flood_args, str(HOLD_S), str(out), cwd=REPO
        )
        for out in outs
    ]
    registry, metrics = setup.proxy.registry, setup.proxy.metrics
    oldest_beat = 0.0
    try:
        while any(flood.returncode is None for flood in floods):
            now = time.monotonic()
            oldest_beat = max([oldest_beat, *(inst.heartbeat_age(now) or 0.0 for inst in registry.instances.values())])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(flood.wait() for flood in floods)), 0.25)
    finally:
        for flood in floods:
            if flood.returncode is None:
                flood.kill()
                await flood.wait()
        stop.set()
        await asyncio.gather(*beats)
    tallies = [json.loads(out.read_text()) for out in outs]
    assert sum(tally["opened"] for tally in tallies) == FLOOD_CONNECTIONS, tallies  # most refused at once
    assert metrics.registration_frames.labels("refused_unknown")._value.get() > 0
    assert metrics.registration_peers_dropped.labels("over_bound")._value.get() > 0
    assert metrics.evictions.labels("P")._value.get() == metrics.evictions.labels("D")._value.get() == 0
    assert oldest_beat < TTL_S, f"an engine's heartbeat aged {oldest_beat:.1f} s under the flood"
    async with setup.client.get(setup.url + "/ready") as resp:
        assert resp.status == 200, await resp.text()
    for _ in range(REQUESTS):
        status, body = await setup.post("/v1/completions", {"model": "m", "prompt": "Hello", "max_tokens": 4})
        assert status == 200, body
    assert len(setup.prefill.requests) == len(setup.decode.requests) == REQUESTS
    assert set(registry.instances) == {setup.prefill.http_address, setup.decode.http_address}


def test_four_peers_pushing_60kb_frames_add_little_to_the_proxys_memory(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{TEST_PORTS.port()}"
    log = (tmp_path / "proxy.log").open("w")
    proxy = subprocess.Popen(
        [sys.executable, "-m", "pd_runtime.cli", "proxy", "--port", str(TEST_PORTS.port()),
         "--admin-port", str(TEST_PORTS.port()), "--registration-address", address, "--transfer-mode", "write"],
        stderr=log,
    )  # fmt: skip
    context = zmq.Context()
    peers = [context.socket(zmq.DEALER) for _ in range(BIG_FRAME_PEERS)]
    try:
        _wait_for_line(tmp_path / "proxy.log", "proxy ready to serve", proxy)
        process = psutil.Process(proxy.pid)
        before = process.memory_info().rss
        for peer in peers:
            peer.setsockopt(zmq.LINGER, 0)
            peer.connect(address)
        frame = b"\x00" * BIG_FRAME_BYTES
        deadline = time.monotonic() + PUSH_S
        while time.monotonic() < deadline:
            for peer in peers:
                with contextlib.suppress(zmq.Again):
                    peer.send(frame, zmq.NOBLOCK)
            time.sleep(0.001)
        added = process.memory_info().rss - before
    finally:
        for peer in peers:
            peer.close(0)
        context.term()
        proxy.terminate()
        proxy.wait(timeout=20)
        log.close()
    assert added < RSS_BUDGET_BYTES, f"4 peers added {added / 2**20:.1f} MiB"


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)
