"""The legs our proxy sends beside the legs vLLM's official router sends, for the same requests to the same
recording engines (docs/proxy.md, "Beside vLLM's router").

Both front ends get the same client requests (a streamed completion and a whole chat completion, each
with the client's own trace context, request id and kv_transfer_params), in write and read mode, against
one pair of real HTTP engines that record every leg. Each leg becomes a flat contract (path, headers, body
keys and values, kv_transfer_params, with ids reduced to their format). Our side must equal
``OURS`` exactly, so a leg of ours that changes fails here; vllm-router's side must differ from ours in
exactly the documented ``DIFFERENCES``, each named in docs/proxy.md's table, so a router release that
changes its legs fails here too and the table gets revisited.

vllm-router runs from its own cached venv (benchmarks/router_venv.sh, pinned 0.1.17); ``make unit`` creates
it and points ``PD_VLLM_ROUTER`` at its binary (then a missing binary fails). Without either, only our side
is checked and the comparison is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pd_runtime.proxy.server import ProxyServer
from tests.ports import TEST_PORTS
from tests.proxy.proxy_fakes import FakeEngine, Recorded, Registrar, proxy_config, start_proxy, wait_for

ROUTER_VERSION = "0.1.17"
ROUTER = Path(
    os.environ.get("PD_VLLM_ROUTER")
    or Path.home() / ".cache" / "pd-operator-router" / f"venv-{ROUTER_VERSION}" / "bin" / "vllm-router"
)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "proxy.md"
ABSENT = "(absent)"

P_ZMQ = "host:127.0.0.1,handshake:6301,notify:6105"
D_ZMQ = "host:127.0.0.1,handshake:7301,notify:7501"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CLIENT_HEADERS = {
    "traceparent": TRACEPARENT,
    "tracestate": "vendor=opaque",
    "X-Request-Id": "client-chosen-id",
    "X-Custom": "not-for-engines",
}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": (
        "/v1/completions",
        {
            "model": "m",
            "prompt": "Hello there",
            "max_tokens": 16,
            "min_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "request_id": "client-chosen",
            "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "evil"},
        },
    ),
    "chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 16,
            "request_id": "client-chosen",
        },
    ),
}

# Formats the ids are reduced to.
_INTERNAL = rf"___prefill_addr_{re.escape(P_ZMQ)}___decode_addr_{re.escape(D_ZMQ)}_[0-9a-f]{{32}}"
RID = "___prefill_addr_<P zmq>___decode_addr_<D zmq>_<32 hex>"
ID_FORMATS = {
    RID: re.compile(rf"^{_INTERNAL}$"),
    "tx-<uuid4>": re.compile(r"^tx-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"),
    "tx-<32 hex>": re.compile(r"^tx-[0-9a-f]{32}$"),
    "cmpl-<32 hex>-0-<8 hex>": re.compile(r"^cmpl-[0-9a-f]{32}-0-[0-9a-f]{8}$"),
    f"cmpl-{RID}-0-<8 hex>": re.compile(rf"^cmpl-{_INTERNAL}-0-[0-9a-f]{{8}}$"),
}


def _form(value: Any, names: dict[str, str]) -> Any:
    if not isinstance(value, str):
        return value
    if value in names:
        return names[value]
    return next((name for name, pattern in ID_FORMATS.items() if pattern.match(value)), value)


def contract(leg: Recorded, names: dict[str, str]) -> dict[str, Any]:
    """One leg as flat ``kind:name -> value``, ids reduced to their format and the test's own values
    (``names``) to their names, transport headers left out."""
    flat: dict[str, Any] = {"path": leg.path}
    for name, value in leg.headers.items():
        if name.lower() not in ("host", "content-length"):
            flat[f"header:{name.lower()}"] = _form(value, names)
    for key, value in leg.body.items():
        if key == "kv_transfer_params" and isinstance(value, dict):
            flat |= {f"kv:{k}": _form(v, names) for k, v in value.items()}
        else:
            flat[f"body:{key}"] = _form(value, names)
    return flat


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``key -> (ours, theirs)`` wherever the two legs differ (ABSENT where one lacks the key)."""
    return {
        key: (ours.get(key, ABSENT), theirs.get(key, ABSENT))
        for key in sorted(ours.keys() | theirs.keys())
        if ours.get(key, ABSENT) != theirs.get(key, ABSENT)
    }


@dataclass
class Engines:
    prefill: FakeEngine
    decode: FakeEngine

    def names(self) -> dict[str, str]:
        return {
            TRACEPARENT: "<client's>",
            CLIENT_HEADERS["tracestate"]: "<client's>",
            str(self.prefill.port): "<P http port>",
            str(self.decode.port): "<D http port>",
        }

    def legs(self, answer_id: str) -> dict[str, dict[str, Any]]:
        """This request's legs (one each) and the response id its client got; the records are cleared."""
        (prefill,), (decode,) = self.prefill.requests, self.decode.requests
        self.prefill.requests.clear()
        self.decode.requests.clear()
        return {
            "prefill": contract(prefill, self.names()),
            "decode": contract(decode, self.names()),
            "client": {"id": _form(answer_id, {})},
        }


@contextlib.asynccontextmanager
async def engines() -> AsyncIterator[Engines]:
    events: list[str] = []
    pair = Engines(
        FakeEngine("P", events, handshake_port=6301, notify_port=6105),
        FakeEngine("D", events, handshake_port=7301, notify_port=7501),
    )
    await pair.prefill.start()
    await pair.decode.start()
    try:
        yield pair
    finally:
        await pair.prefill.stop()
        await pair.decode.stop()


@contextlib.asynccontextmanager
async def heartbeats(address: str, pair: Engines, mode: str) -> AsyncIterator[None]:
    """Both engines' G2 heartbeats every second, as vLLM 0.31's send them (vllm-router drops an engine 5 s
    after its last beat)."""
    registrar = Registrar(address)

    async def beat() -> None:
        while True:
            for engine in (pair.prefill, pair.decode):
                await registrar.send(engine.g2_registration(mode))
            await asyncio.sleep(1.0)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        registrar.close()


async def _send(client: aiohttp.ClientSession, url: str, case: str) -> str:
    """One client request; returns the response id it got (a stream's from its first event)."""
    path, body = CASES[case]
    async with client.post(url + path, json=body, headers=CLIENT_HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    first = raw.split(b"\n\n", 1)[0].removeprefix(b"data: ") if body.get("stream") else raw
    answer_id: str = json.loads(first)["id"]
    return answer_id


async def through_ours(pair: Engines, mode: str) -> dict[str, dict[str, dict[str, Any]]]:
    proxy: ProxyServer = await start_proxy(proxy_config())
    try:
        async with heartbeats(proxy.config.registration_address, pair, mode), aiohttp.ClientSession() as client:
            await wait_for(lambda: not proxy.not_ready_reason(), what="P and D routable")
            url = f"http://127.0.0.1:{proxy.api_port}"
            recorded = {}
            for case in CASES:
                recorded[case] = pair.legs(await _send(client, url, case))
            return recorded
    finally:
        await proxy.stop()


async def through_router(pair: Engines, mode: str) -> dict[str, dict[str, dict[str, Any]]]:
    discovery, port = TEST_PORTS.port(), TEST_PORTS.port()
    argv = [
        "--vllm-pd-disaggregation", "--kv-connector", "moriio",
        "--prefill", f"http://{pair.prefill.http_address}", "--decode", f"http://{pair.decode.http_address}",
        "--vllm-discovery-address", f"127.0.0.1:{discovery}",
        "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin", "--log-level", "warning",
    ]  # fmt: skip
    router = await asyncio.create_subprocess_exec(
        str(ROUTER), *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with heartbeats(f"tcp://127.0.0.1:{discovery}", pair, mode), aiohttp.ClientSession() as client:
            await _router_ready(client, url, router)
            recorded = {}
            for case in CASES:
                answer_id = await _send(client, url, case)
                # write mode: its prefill leg runs in the background, after decode's answer perhaps
                await wait_for(lambda: bool(pair.prefill.requests), what="the router's prefill leg")
                recorded[case] = pair.legs(answer_id)
            return recorded
    finally:
        router.terminate()
        await router.wait()


async def _router_ready(client: aiohttp.ClientSession, url: str, router: asyncio.subprocess.Process) -> None:
    """Until vllm-router answers ``/health`` 200 (its discovery has a registered P and D), within 60 s."""
    for _ in range(600):
        if router.returncode is not None:
            assert router.stderr is not None
            raise AssertionError(f"vllm-router exited: {(await router.stderr.read()).decode()[-2000:]}")
        with contextlib.suppress(aiohttp.ClientError):
            async with client.get(url + "/health") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise AssertionError("vllm-router saw no registered prefill and decode engine within 60 s")


# -- our side: every leg, literally ----------------------------------------------------------------------

TRACE = {"header:traceparent": "<client's>", "header:tracestate": "<client's>"}
HEADERS = {"header:content-type": "application/json", "header:x-request-id": RID, **TRACE}
PREFILL_KV = {
    "kv:do_remote_decode": True,
    "kv:do_remote_prefill": False,
    "kv:remote_engine_id": None,
    "kv:remote_block_ids": None,
    "kv:remote_host": "127.0.0.1",
    "kv:remote_port": "<D http port>",
    "kv:remote_handshake_port": 7301,
    "kv:remote_notify_port": 7501,
    "kv:remote_dp_size": 1,
    "kv:remote_tp_size": 4,
    "kv:tp_size": 4,
    "kv:transfer_id": "tx-<uuid4>",
}
DECODE_KV = {
    "kv:do_remote_decode": False,
    "kv:do_remote_prefill": True,
    "kv:remote_host": "127.0.0.1",
    "kv:remote_port": "<P http port>",
    "kv:remote_handshake_port": 6301,
    "kv:remote_notify_port": 6105,
    "kv:remote_dp_size": 1,
    "kv:remote_tp_size": 4,
    "kv:tp_size": 4,
    "kv:transfer_id": "tx-<uuid4>",
}
READ_FROM_PREFILL = {
    "WRITE": {"kv:remote_engine_id": None, "kv:remote_block_ids": None},
    "READ": {"kv:remote_engine_id": "127.0.0.1:6301", "kv:remote_block_ids": [1, 2, 3]},  # P's answer
}
COMPLETION = {"path": "/v1/completions", "body:model": "m", "body:prompt": "Hello there", "body:temperature": 0}
CHAT = {"path": "/v1/chat/completions", "body:model": "m", "body:messages": [{"role": "user", "content": "hi"}]}
OURS_BODIES = {
    ("completion", "prefill"): COMPLETION | {"body:max_tokens": 1, "body:min_tokens": 1, "body:stream": False},
    ("completion", "decode"): COMPLETION
    | {
        "body:max_tokens": 16,
        "body:min_tokens": 4,
        "body:stream": True,
        "body:stream_options": {"include_usage": True},
    },
    ("chat", "prefill"): CHAT
    | {"body:max_tokens": 1, "body:max_completion_tokens": 1, "body:min_tokens": 1, "body:stream": False},
    ("chat", "decode"): CHAT
    | {"body:max_completion_tokens": 16, "body:stream": True, "body:stream_options": {"include_usage": True}},
}


def ours_expected(mode: str, case: str) -> dict[str, dict[str, Any]]:
    return {
        "prefill": OURS_BODIES[case, "prefill"] | HEADERS | PREFILL_KV,
        "decode": OURS_BODIES[case, "decode"] | HEADERS | DECODE_KV | READ_FROM_PREFILL[mode],
        "client": {"id": "cmpl-<32 hex>-0-<8 hex>"},
    }


# -- where vllm-router's legs differ: each row is one of docs/proxy.md's table, by its first column -----

PEER_ADDRESS = ("kv:remote_host", "kv:remote_port", "kv:remote_handshake_port", "kv:remote_notify_port", "kv:tp_size")
ROWS: dict[str, dict[str, Any]] = {
    "client's `request_id`": {"body:request_id": "client-chosen"},
    "`Authorization`": {"header:authorization": "Bearer"},
    "`Accept`": {"header:accept": "*/*"},
    "transfer id": {"kv:transfer_id": "tx-<32 hex>"},
    "explicit peer address": dict.fromkeys(PEER_ADDRESS, ABSENT),
    "read mode: prefill's `remote_tp_size`": {"kv:remote_tp_size": ABSENT},
    "read mode: decode's peer from prefill's answer": {
        "kv:remote_handshake_port": "6301",
        "kv:remote_notify_port": "6105",
        "kv:remote_port": ABSENT,
        "kv:remote_tp_size": ABSENT,
    },
    "completions body defaults": {
        "body:echo": False,
        "body:ignore_eos": False,
        "body:no_stop_trim": False,
        "body:return_hidden_states": False,
        "body:skip_special_tokens": True,
    },
    "chat body defaults": {
        "body:continue_final_message": False,
        "body:ignore_eos": False,
        "body:include_reasoning": True,
        "body:logprobs": False,
        "body:no_stop_trim": False,
        "body:return_hidden_states": False,
        "body:separate_reasoning": True,
        "body:skip_special_tokens": True,
        "body:stream_reasoning": True,
    },
    "chat decode `stream`": {"body:stream": False, "body:stream_options": ABSENT},
    "response id": {"id": f"cmpl-{RID}-0-<8 hex>"},
}
EVERY_LEG = ("client's `request_id`", "`Authorization`", "`Accept`", "transfer id")
DEFAULTS = {"completion": ("completions body defaults",), "chat": ("chat body defaults",)}


def documented_rows(mode: str, case: str, leg: str) -> list[str]:
    if leg == "client":
        return ["response id"]
    rows = [*EVERY_LEG, *DEFAULTS[case]]
    if leg == "prefill":
        rows += ["explicit peer address"] + (["read mode: prefill's `remote_tp_size`"] if mode == "READ" else [])
    elif mode == "WRITE":
        rows += ["explicit peer address"]
    else:
        rows += ["read mode: decode's peer from prefill's answer"]
    if case == "chat" and leg == "decode":
        rows += ["chat decode `stream`"]
    return rows


def documented_differences(ours: dict[str, Any], rows: list[str]) -> dict[str, tuple[Any, Any]]:
    """What ``rows`` say vllm-router sends instead of ours (a row's key that ours lacks too is no difference)."""
    return differences(ours, ours | {key: value for row in rows for key, value in ROWS[row].items()})


def test_every_row_is_in_the_docs() -> None:
    section = DOCS.read_text().split("## Beside vLLM's router", 1)[1].split("\n## ", 1)[0]
    table = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")}
    assert set(ROWS) <= table, set(ROWS) - table


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_legs_beside_vllm_router(mode: str) -> None:
    async with engines() as pair:
        ours = await through_ours(pair, mode)
        theirs = await through_router(pair, mode) if ROUTER.exists() else None
    for case in CASES:
        assert ours[case] == ours_expected(mode, case), case
    if theirs is None:
        assert "PD_VLLM_ROUTER" not in os.environ, f"PD_VLLM_ROUTER names no vllm-router: {ROUTER}"
        pytest.skip(f"vllm-router not installed at {ROUTER} (make unit installs it: benchmarks/router_venv.sh)")
    for case, legs in theirs.items():
        for leg, contract_of_leg in legs.items():
            got = differences(ours[case][leg], contract_of_leg)
            assert got == documented_differences(ours[case][leg], documented_rows(mode, case, leg)), (case, leg)
