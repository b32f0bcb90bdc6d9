"""Heartbeats and the fault knobs, against real sockets and processes.

The payloads are literal: docs/protocol.md#registration-socket, docs/protocol.md#registration-g2.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from tests.ports import TEST_PORTS
from tests.sim.sim_helpers import (
    EngineFactory,
    engine_ports,
    g2_request_id,
    kv_config,
    metric,
    scrape,
    transfer_id,
    zmq_address,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def registrar() -> Iterator[tuple[zmq.asyncio.Socket, int]]:
    """A proxy-side ROUTER on a free port, as the proxy binds it."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    ctx.destroy(linger=0)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def spawn(started: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pd_runtime.cli", "sim-engine", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started.append(proc)
    return proc


async def next_frame(sock: zmq.asyncio.Socket, timeout: float = 10.0) -> dict[str, Any]:
    frames = await asyncio.wait_for(sock.recv_multipart(), timeout)
    assert len(frames) == 2, "one identity frame plus one single-frame message"
    payload: dict[str, Any] = msgpack.unpackb(frames[1], raw=False)
    return payload


async def test_g2_heartbeats_from_one_process_stop_when_it_dies(
    registrar: tuple[zmq.asyncio.Socket, int], processes: list[subprocess.Popen[bytes]]
) -> None:
    sock, port = registrar
    ports = engine_ports(tp=4)
    proc = spawn(processes, "m", "-tp", "4", "--port", str(ports.http), "--kv-transfer-config",
                 kv_config("kv_consumer", ports, read=True, proxy_port=port))  # fmt: skip
    first = await next_frame(sock)
    assert first == {  # docs/protocol.md#registration-g2, literally
        "type": "D",
        "http_address": f"127.0.0.1:{ports.http}",
        "zmq_address": f"host:127.0.0.1,handshake:{ports.handshake},notify:{ports.notify}",
        "dp_size": 1,
        "tp_size": 4,
        "transfer_mode": "READ",
    }
    t0 = time.monotonic()
    await next_frame(sock)
    # G2 beats every 3 s: not back to back, and again (the bounds leave a loaded machine seconds of slack).
    assert 1.0 < time.monotonic() - t0 < 30.0
    proc.kill()
    proc.wait()
    with pytest.raises(TimeoutError):
        await next_frame(sock, timeout=3.5)


async def test_g1_registration_on_request(
    registrar: tuple[zmq.asyncio.Socket, int], processes: list[subprocess.Popen[bytes]]
) -> None:
    sock, port = registrar
    ports = engine_ports()
    spawn(processes, "m", "--port", str(ports.http), "--sim-registration", "g1", "--kv-transfer-config",
          kv_config("kv_producer", ports, proxy_port=port))  # fmt: skip
    frame = await next_frame(sock)
    assert frame == {  # docs/protocol.md#registration-g1, literally
        "type": "register",
        "role": "P",
        "index": "0",
        "request_address": f"http://127.0.0.1:{ports.http}/v1/completions",
        "handshake_port": ports.handshake,
        "notify_port": ports.notify,
        "dp_size": 1,
        "tp_size": 1,
        "transfer_mode": "WRITE",
    }


async def test_no_register_knob(
    registrar: tuple[zmq.asyncio.Socket, int], processes: list[subprocess.Popen[bytes]]
) -> None:
    sock, port = registrar
    ports = engine_ports()
    spawn(processes, "m", "--port", str(ports.http), "--sim-no-register", "--kv-transfer-config",
          kv_config("kv_producer", ports, proxy_port=port))  # fmt: skip
    with pytest.raises(TimeoutError):
        await next_frame(sock, timeout=3.0)


async def test_crash_after_n_requests(processes: list[subprocess.Popen[bytes]]) -> None:
    port = TEST_PORTS.port()
    proc = spawn(processes, "m", "--port", str(port), "--sim-crash-after", "2")
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 60  # a loaded machine may take many seconds to start the engine
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/health"):
                    break
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        for _ in range(2):
            async with session.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"}) as resp:
                assert resp.status == 200
    assert await asyncio.to_thread(proc.wait, 60) != 0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_unresponsive_engine_never_answers(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "--sim-unresponsive"])
    with pytest.raises(TimeoutError):
        async with http.get(eng.url + "/health", timeout=aiohttp.ClientTimeout(total=0.5)):
            pass


async def test_slow_first_byte(start_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await start_engine(["m", "--port", str(TEST_PORTS.port()), "--sim-first-byte-delay", "0.3"])
    started = time.monotonic()
    async with http.post(eng.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as resp:
        assert resp.status == 200
    assert time.monotonic() - started >= 0.3


async def test_dropped_notifies_leave_the_transfer_to_the_defer_timeout(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    ports = engine_ports()
    argv = ["m", "--port", str(ports.http), "--sim-drop-notify", "1",
            "--kv-transfer-config", kv_config("kv_producer", ports, defer_timeout="0.3")]  # fmt: skip
    p = await start_engine(argv)
    tid = transfer_id()
    peer = zmq_address(TEST_PORTS.port(), TEST_PORTS.port())
    body = {"prompt": [1] * 10, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid}}
    headers = {"X-Request-Id": g2_request_id(zmq_address(ports.handshake, ports.notify), peer)}
    async with http.post(p.url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{ports.notify}")
    message = {"req_id": "cmpl-x", "transfer_id": tid, "block_notify_list": [1], "decode_rank": 0,
               "type": "remote_blocks"}  # fmt: skip
    await dealer.send(msgpack.packb(message))
    await asyncio.sleep(0.8)
    ctx.destroy(linger=0)
    text = await scrape(http, p.url)
    assert metric(text, "pd_sim_kv_notify_messages_total", direction="dropped", type="remote_blocks") == 1
    assert metric(text, "pd_sim_kv_transfers_total", outcome="expired") == 1
    assert json.loads(json.dumps(metric(text, "pd_sim_kv_blocks_held"))) == 0
