"""Side-channel contract: a simulated engine against hand-written peers that speak the formats literally.

The peers here are raw ZMQ sockets that build and check frames from docs/protocol.md#side-channels, not from
pd_runtime.protocol, so the simulator cannot agree with itself and disagree with vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from tests.ports import TEST_PORTS
from tests.sim.sim_helpers import (
    EngineFactory,
    Ports,
    engine_ports,
    g2_request_id,
    kv_config,
    metric,
    scrape,
    transfer_id,
    until_metric,
    zmq_address,
)

pytestmark = pytest.mark.timeout(30)


class FakePeer:
    """A peer engine's listeners: a handshake ROUTER that answers get_meta_msg, a notify ROUTER that records."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.ports = Ports(0, TEST_PORTS.block(1), TEST_PORTS.block(1))
        self.handshake = self.ctx.socket(zmq.ROUTER)
        self.handshake.bind(f"tcp://127.0.0.1:{self.ports.handshake}")
        self.notify = self.ctx.socket(zmq.ROUTER)
        self.notify.bind(f"tcp://127.0.0.1:{self.ports.notify}")
        self.handshakes = 0
        self._task = asyncio.create_task(self._answer())

    @property
    def zmq(self) -> str:
        return zmq_address(self.ports.handshake, self.ports.notify)

    async def _answer(self) -> None:
        while True:
            identity, *frames = await self.handshake.recv_multipart()
            assert frames == [b"get_meta_msg"]
            self.handshakes += 1
            meta = {
                "engine_id": "fake",
                "agent_metadata": b"x",
                "kv_caches_base_addr": [1],
                "num_blocks": 1,
                "block_len": 1,
                "attn_backend_name": "x",
            }
            await self.handshake.send_multipart([identity, b"", msgpack.dumps(meta)])
            await self.handshake.send_multipart([identity, b"", msgpack.dumps({"layer.0": [b"d"]})])

    async def next_notify(self, timeout: float = 5.0) -> Any:
        _, frame = await asyncio.wait_for(self.notify.recv_multipart(), timeout)
        return msgpack.loads(frame)

    async def send_notify(self, port: int, payload: bytes) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        await sock.send(payload)
        await asyncio.sleep(0.05)
        sock.close(linger=100)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, AssertionError):
            await self._task
        self.ctx.destroy(linger=0)


@pytest.fixture
async def peer() -> AsyncIterator[FakePeer]:
    fake = FakePeer()
    yield fake
    await fake.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def engine_argv(role: str, ports: Ports, read: bool = False, tp: int = 1, **extra: Any) -> list[str]:
    return [
        "sim",
        "-tp",
        str(tp),
        "--port",
        str(ports.http),
        "--kv-transfer-config",
        kv_config(role, ports, read, **extra),
    ]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], xid: str) -> tuple[int, Any]:
    async with http.post(url + "/v1/completions", json=body, headers={"X-Request-Id": xid}) as resp:
        return resp.status, await resp.json()


async def test_handshake_answers_get_meta_msg_with_two_messages_on_every_rank(start_engine: EngineFactory) -> None:
    ports = engine_ports(tp=2)
    await start_engine(engine_argv("kv_producer", ports, tp=2))
    ctx = zmq.asyncio.Context()
    try:
        for rank in range(2):  # docs/protocol.md#rank-ports: handshake_port + dp_rank + tp_rank
            sock = ctx.socket(zmq.DEALER)
            sock.connect(f"tcp://127.0.0.1:{ports.handshake + rank}")
            await sock.send(b"get_meta_msg")
            first = await asyncio.wait_for(sock.recv_multipart(), 5)
            second = await asyncio.wait_for(sock.recv_multipart(), 5)
            assert first[0] == b"" and second[0] == b""
            meta = msgpack.loads(first[1])
            assert isinstance(meta["engine_id"], str) and isinstance(meta["agent_metadata"], bytes)
            assert all(isinstance(a, int) for a in meta["kv_caches_base_addr"])
            assert isinstance(meta["num_blocks"], int) and isinstance(meta["block_len"], int)
            assert isinstance(meta["attn_backend_name"], str)
            layers = msgpack.loads(second[1])
            assert layers and all(
                isinstance(k, str) and all(isinstance(d, bytes) for d in v) for k, v in layers.items()
            )
            sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)


async def test_write_mode_consumer_sends_remote_blocks_and_waits_for_write_done(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    ports = engine_ports()
    d = await start_engine(engine_argv("kv_consumer", ports))
    tid = transfer_id()
    xid = g2_request_id(peer.zmq, zmq_address(ports.handshake, ports.notify))
    body = {
        "prompt": list(range(100)),
        "max_tokens": 4,
        "kv_transfer_params": {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_dp_size": 1,
            "remote_tp_size": 1,
            "tp_size": 1,
            "transfer_id": tid,
        },
    }
    request = asyncio.create_task(post(http, d.url, body, xid))
    blocks = await peer.next_notify()
    # docs/protocol.md#notify-messages G2 remote_blocks, to P.notify_port + remote_dp_rank + i
    assert set(blocks) == {"req_id", "transfer_id", "block_notify_list", "decode_rank", "type"}
    assert blocks["type"] == "remote_blocks" and blocks["transfer_id"] == tid and blocks["decode_rank"] == 0
    assert blocks["req_id"].startswith("cmpl-") and blocks["block_notify_list"]
    assert all(isinstance(b, int) for b in blocks["block_notify_list"])
    await asyncio.sleep(0.2)
    assert not request.done(), "decoding must wait for write_done"
    await peer.send_notify(ports.notify, msgpack.dumps({"type": "write_done", "transfer_id": tid}))
    status, answer = await asyncio.wait_for(request, 5)
    assert status == 200 and answer["usage"]["completion_tokens"] == 4
    assert answer["id"].startswith(f"cmpl-{xid}-0")
    text = await scrape(http, d.url)
    assert metric(text, "pd_sim_kv_transfers_total", outcome="completed") == 1
    assert metric(text, "pd_sim_kv_notify_messages_total", direction="received", type="write_done") == 1


async def test_consumer_accepts_a_raw_transfer_id_as_completion(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    """G1b: the completion notify is the raw transfer id string (docs/protocol.md#notify-messages)."""
    ports = engine_ports()
    d = await start_engine(engine_argv("kv_consumer", ports))
    tid = transfer_id()
    params = {
        "do_remote_prefill": True,
        "remote_host": "127.0.0.1",
        "remote_handshake_port": peer.ports.handshake,
        "remote_notify_port": peer.ports.notify,
        "transfer_id": tid,
    }
    request = asyncio.create_task(
        post(http, d.url, {"prompt": [1, 2, 3], "max_tokens": 2, "kv_transfer_params": params}, "plain-id")
    )
    assert (await peer.next_notify())["transfer_id"] == tid  # peer found from the explicit keys
    await peer.send_notify(ports.notify, tid.encode())
    status, _ = await asyncio.wait_for(request, 5)
    assert status == 200


async def test_read_mode_consumer_handshakes_reads_and_releases(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    ports = engine_ports()
    d = await start_engine(engine_argv("kv_consumer", ports, read=True))
    tid = transfer_id()
    xid = g2_request_id(peer.zmq, zmq_address(ports.handshake, ports.notify))
    params = {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": "127.0.0.1:1",
        "remote_block_ids": [1, 2, 3],
        "remote_dp_size": 1,
        "remote_tp_size": 1,
        "transfer_id": tid,
    }
    status, answer = await post(http, d.url, {"prompt": [1] * 40, "max_tokens": 3, "kv_transfer_params": params}, xid)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3
    assert peer.handshakes == 1
    # docs/protocol.md#notify-messages G2: {"type": "release", "transfer_id", "consumer_tp_size"}
    assert await peer.next_notify() == {"type": "release", "transfer_id": tid, "consumer_tp_size": 1}


async def test_write_mode_producer_returns_params_then_writes_and_sends_write_done(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    ports = engine_ports()
    p = await start_engine(engine_argv("kv_producer", ports))
    tid = transfer_id()
    xid = g2_request_id(zmq_address(ports.handshake, ports.notify), peer.zmq)
    params = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_dp_size": 1,
        "remote_tp_size": 1,
        "transfer_id": tid,
    }
    status, answer = await post(http, p.url, {"prompt": [5] * 50, "max_tokens": 1, "kv_transfer_params": params}, xid)
    assert status == 200
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 1
    kv = answer["kv_transfer_params"]
    # docs/protocol.md#prefill-answer G2 keys
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == f"127.0.0.1:{ports.handshake}" and kv["remote_host"] == "127.0.0.1"
    assert int(kv["remote_handshake_port"]) == ports.handshake and int(kv["remote_notify_port"]) == ports.notify
    assert kv["remote_dp_size"] == 1 and kv["tp_size"] == 1 and kv["transfer_id"] == tid
    assert kv["remote_block_ids"] and all(isinstance(b, int) for b in kv["remote_block_ids"])
    text = await scrape(http, p.url)
    assert metric(text, "pd_sim_kv_blocks_held") > 0, "blocks are held until the write completes"
    remote_blocks = {
        "req_id": "cmpl-d",
        "transfer_id": tid,
        "block_notify_list": [7, 8],
        "decode_rank": 0,
        "type": "remote_blocks",
    }
    await peer.send_notify(ports.notify, msgpack.dumps(remote_blocks))
    assert await peer.next_notify() == {"type": "write_done", "transfer_id": tid}
    assert peer.handshakes == 1, "P handshakes with D before its first write"
    await asyncio.sleep(0.05)
    text = await scrape(http, p.url)
    assert metric(text, "pd_sim_kv_blocks_held") == 0
    assert metric(text, "pd_sim_kv_transfers_total", outcome="completed") == 1


async def test_read_mode_producer_holds_blocks_until_release_or_defer_timeout(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    """With the multiprocess executor the operator renders (``mp``) every step of vLLM's busy loop, which
    steps while it holds a deferred send, reaches ``update_connector_output``: an idle engine reaps too."""
    ports = engine_ports()
    argv = [*engine_argv("kv_producer", ports, read=True, defer_timeout="0.5"), "--distributed-executor-backend", "mp"]
    p = await start_engine(argv)
    params = {"do_remote_decode": True, "transfer_id": transfer_id()}
    released_tid = transfer_id()
    status, answer = await post(
        http,
        p.url,
        {"prompt": [1] * 20, "max_tokens": 1, "kv_transfer_params": {**params, "transfer_id": released_tid}},
        "r1",
    )
    assert status == 200 and answer["kv_transfer_params"]["transfer_id"] == released_tid
    await post(http, p.url, {"prompt": [1] * 20, "max_tokens": 1, "kv_transfer_params": params}, "r2")
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{ports.notify}")
    await sock.send(msgpack.dumps({"type": "release", "transfer_id": released_tid, "consumer_tp_size": 1}))
    await asyncio.sleep(1.0)
    sock.close(linger=0)
    ctx.destroy(linger=0)
    text = await scrape(http, p.url)
    assert metric(text, "pd_sim_kv_transfers_total", outcome="completed") == 1
    assert metric(text, "pd_sim_kv_transfers_total", outcome="expired") == 1
    assert metric(text, "pd_sim_kv_blocks_held") == 0


async def test_an_idle_uni_executor_prefill_keeps_an_expired_sends_blocks_until_its_next_step(
    start_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    """docs/vllm-versions.md#deferred-send-reaping: with the ``uni`` executor an idle step has no KV connector
    output, so vLLM reaps a deferred send past ``defer_timeout`` only at the end of the next forward step."""
    ports = engine_ports()
    argv = [*engine_argv("kv_producer", ports, read=True, defer_timeout="0.3"), "--num-gpu-blocks-override", "100"]
    p = await start_engine([*argv, "--distributed-executor-backend", "uni"])
    params = {"do_remote_decode": True, "transfer_id": transfer_id()}
    status, _ = await post(http, p.url, {"prompt": [1] * 20, "max_tokens": 1, "kv_transfer_params": params}, "r1")
    assert status == 200
    await asyncio.sleep(1.0)  # past defer_timeout, nothing scheduled
    idle = await scrape(http, p.url)
    assert metric(idle, "pd_sim_kv_blocks_held") == 2
    assert metric(idle, "pd_sim_kv_transfers_total", outcome="expired") == 0
    assert metric(idle, "vllm:kv_cache_usage_perc", engine="0") > 0
    status, _ = await post(http, p.url, {"prompt": [1] * 20, "max_tokens": 1}, "plain")
    assert status == 200
    text = await until_metric(http, p.url, "pd_sim_kv_transfers_total", 1, outcome="expired")
    assert metric(text, "pd_sim_kv_blocks_held") == 0
    assert metric(text, "vllm:kv_cache_usage_perc", engine="0") == 0


def _remote_body(tid: str, max_tokens: int = 4) -> dict[str, Any]:
    params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_tp_size": 1, "transfer_id": tid}
    return {"prompt": list(range(100)), "max_tokens": max_tokens, "kv_transfer_params": params}


async def test_write_mode_consumer_sends_its_blocks_only_once_below_max_num_seqs(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    """vLLM allocates a waiting request's blocks (and so sends remote_blocks) only while fewer than
    max_num_seqs run: under load the block list reaches prefill late, which defer_timeout punishes."""
    ports = engine_ports()
    argv = [*engine_argv("kv_consumer", ports), "--max-num-seqs", "1", "--profile", "qwen3-235b-mi300x"]
    d = await start_engine(argv)
    xid = g2_request_id(peer.zmq, zmq_address(ports.handshake, ports.notify))
    first, second = transfer_id(), transfer_id()
    running = asyncio.create_task(post(http, d.url, _remote_body(first, max_tokens=60), xid))
    assert (await peer.next_notify())["transfer_id"] == first
    await peer.send_notify(ports.notify, msgpack.dumps({"type": "write_done", "transfer_id": first}))
    await asyncio.sleep(0.3)  # the first request decodes (about 60 x 25 ms), holding the only slot
    queued = asyncio.create_task(post(http, d.url, _remote_body(second), xid))
    with pytest.raises(TimeoutError):
        await peer.next_notify(timeout=0.3)
    assert not running.done()
    # once the first one finished decoding (1.5 s when idle; a loaded machine only makes it later)
    assert (await peer.next_notify(timeout=20))["transfer_id"] == second
    # its last token freed the slot; the client may still be reading the end of that response
    status, _ = await asyncio.wait_for(running, timeout=10)
    assert status == 200
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)


async def test_write_mode_producer_drops_a_transfer_whose_blocks_come_after_defer_timeout(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    """moriio_engine.py (0.29) MoRIIOWriter._process_deferred_tasks: expired after defer_timeout, marked
    done, blocks freed; the late block list is ignored, so decode never gets write_done."""
    ports = engine_ports()
    p = await start_engine(engine_argv("kv_producer", ports, defer_timeout="0.3"))
    tid = transfer_id()
    xid = g2_request_id(zmq_address(ports.handshake, ports.notify), peer.zmq)
    params = {"do_remote_decode": True, "remote_tp_size": 1, "transfer_id": tid}
    status, _ = await post(http, p.url, {"prompt": [5] * 50, "max_tokens": 1, "kv_transfer_params": params}, xid)
    assert status == 200
    # The transfer expires 0.3 s after the prefill (later on a loaded machine): the block list comes after.
    await until_metric(http, p.url, "pd_sim_kv_transfers_total", 1, outcome="expired")
    late = {"req_id": "cmpl-d", "transfer_id": tid, "block_notify_list": [7], "decode_rank": 0, "type": "remote_blocks"}
    await peer.send_notify(ports.notify, msgpack.dumps(late))
    with pytest.raises(TimeoutError):
        await peer.next_notify(timeout=0.5)
    text = await scrape(http, p.url)
    assert metric(text, "pd_sim_kv_transfers_total", outcome="expired") == 1
    assert metric(text, "pd_sim_kv_blocks_held") == 0


@pytest.mark.parametrize(("version", "tells"), [("0.31.0", False), ("0.33.0", True)])
async def test_a_producer_that_gives_up_on_the_block_list_tells_decode_from_0_33(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession, version: str, tells: bool
) -> None:
    """0.33 moriio_engine.py ``_notify_write_failed``: {"type": "write_failed", "transfer_id"} to decode."""
    ports = engine_ports()
    argv = [*engine_argv("kv_producer", ports, defer_timeout="0.3"), "--vllm-version", version]
    p = await start_engine(argv)
    tid = transfer_id()
    xid = g2_request_id(zmq_address(ports.handshake, ports.notify), peer.zmq)
    params = {"do_remote_decode": True, "remote_tp_size": 1, "remote_dp_size": 1, "transfer_id": tid}
    status, _ = await post(http, p.url, {"prompt": [5] * 50, "max_tokens": 1, "kv_transfer_params": params}, xid)
    assert status == 200
    if tells:
        assert await peer.next_notify(timeout=10) == {"type": "write_failed", "transfer_id": tid}
    else:
        await until_metric(http, p.url, "pd_sim_kv_transfers_total", 1, outcome="expired")
        with pytest.raises(TimeoutError):
            await peer.next_notify(timeout=0.5)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
async def test_write_failed_ends_decodes_wait_by_its_load_failure_policy(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession, policy: str
) -> None:
    """0.33: a write_failed for a request waiting for KV fails it (500, as vLLM's finish reason "error" is
    answered) or has decode compute it; one for a request not allocated yet (max_num_seqs reached) is kept
    and ends that request once it gets its blocks."""
    ports = engine_ports()
    kv = json.loads(kv_config("kv_consumer", ports)) | {"kv_load_failure_policy": policy}
    argv = ["sim", "--port", str(ports.http), "--kv-transfer-config", json.dumps(kv), "--vllm-version", "0.33.0"]
    d = await start_engine([*argv, "--max-num-seqs", "1", "--profile", "qwen3-235b-mi300x"])
    xid = g2_request_id(peer.zmq, zmq_address(ports.handshake, ports.notify))
    first, second = transfer_id(), transfer_id()
    running = asyncio.create_task(post(http, d.url, _remote_body(first), xid))
    assert (await peer.next_notify())["transfer_id"] == first
    queued = asyncio.create_task(post(http, d.url, _remote_body(second), xid))
    await until_metric(http, d.url, "pd_sim_requests_waiting_for_kv", 2)
    await peer.send_notify(ports.notify, msgpack.dumps({"type": "write_failed", "transfer_id": second}))
    await peer.send_notify(ports.notify, msgpack.dumps({"type": "write_failed", "transfer_id": first}))
    results = [await asyncio.wait_for(task, timeout=20) for task in (running, queued)]
    if policy == "fail":
        assert [status for status, _ in results] == [500, 500]
        assert results[0][1]["error"]["message"] == "Internal server error"
    else:
        assert [status for status, _ in results] == [200, 200]
        text = await scrape(http, d.url)
        assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 200
    assert (await peer.next_notify())["transfer_id"] == second  # its block list once allocated, as vLLM's


async def test_a_read_mode_request_aborted_before_allocation_releases_prefills_blocks(
    start_engine: EngineFactory, peer: FakePeer, http: aiohttp.ClientSession
) -> None:
    """0.31-0.34 ``request_finished`` + ``_read_blocks``: no local blocks, so decode only sends release."""
    ports = engine_ports()
    argv = [*engine_argv("kv_consumer", ports, read=True), "--max-num-seqs", "1", "--profile", "qwen3-235b-mi300x"]
    d = await start_engine(argv)
    xid = g2_request_id(peer.zmq, zmq_address(ports.handshake, ports.notify))
    first, second = transfer_id(), transfer_id()
    read = {"remote_engine_id": "127.0.0.1:1", "remote_block_ids": [1, 2], "remote_dp_size": 1}

    def body(tid: str, max_tokens: int) -> dict[str, Any]:
        base = _remote_body(tid, max_tokens)
        return base | {"kv_transfer_params": base["kv_transfer_params"] | read}

    running = asyncio.create_task(post(http, d.url, body(first, 200), xid))
    assert await peer.next_notify() == {"type": "release", "transfer_id": first, "consumer_tp_size": 1}
    queued = asyncio.create_task(post(http, d.url, body(second, 4), xid))
    await until_metric(http, d.url, "pd_sim_requests_waiting_for_kv", 1)
    queued.cancel()  # the client goes away while the request waits for a slot
    await asyncio.gather(queued, return_exceptions=True)
    assert await peer.next_notify() == {"type": "release", "transfer_id": second, "consumer_tp_size": 1}
    assert not running.done()  # released long before the running request freed the slot
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
