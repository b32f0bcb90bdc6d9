"""Shared helpers of the simulator tests: free loopback ports, kv-transfer configs, in-process engines,
X-Request-Id built from docs/protocol.md's literal format, metric scraping."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from pd_runtime.sim.engine import SimEngine
from tests.ports import TEST_PORTS


@dataclass
class Ports:
    http: int
    handshake: int
    notify: int


def engine_ports(tp: int = 1) -> Ports:
    return Ports(TEST_PORTS.port(), TEST_PORTS.block(tp), TEST_PORTS.block(tp))


def kv_config(role: str, ports: Ports, read: bool = False, proxy_port: int | None = None, **extra: Any) -> str:
    conf: dict[str, Any] = {
        "http_port": str(ports.http),
        "handshake_port": str(ports.handshake),
        "notify_port": str(ports.notify),
        "host_ip": "127.0.0.1",
        **extra,
    }
    if proxy_port is not None:
        conf |= {"proxy_ip": "127.0.0.1", "proxy_ping_port": str(proxy_port)}
    if read:
        conf["read_mode"] = "true"
    return json.dumps({"kv_connector": "MoRIIOConnector", "kv_role": role, "kv_connector_extra_config": conf})


@dataclass
class RunningEngine:
    engine: SimEngine
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        self.engine.stopping.set()
        await self.runner.cleanup()
        await self.engine.stop()


EngineFactory = Callable[[list[str]], Awaitable[RunningEngine]]


_SAMPLE_RE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def zmq_address(handshake: int, notify: int, host: str = "127.0.0.1") -> str:
    # docs/protocol.md#registration-g2, written out literally
    return f"host:{host},handshake:{handshake},notify:{notify}"


def g2_request_id(prefill_zmq: str, decode_zmq: str) -> str:
    # docs/protocol.md#request-ids: "___prefill_addr_{P.zmq}___decode_addr_{D.zmq}_{uuid4().hex}"
    return f"___prefill_addr_{prefill_zmq}___decode_addr_{decode_zmq}_{uuid.uuid4().hex}"


def transfer_id() -> str:
    return f"tx-{uuid.uuid4()}"


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE_RE.match(line)
        if match is None or match["name"] != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(match["value"])
    return total


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def until_metric(
    session: aiohttp.ClientSession, url: str, name: str, value: float, timeout_s: float = 30.0, **labels: str
) -> str:
    """The engine's metrics once ``name`` (with ``labels``) reads ``value``, or at the deadline: a liveness
    wait, generous because a loaded machine runs the engine's background work late."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        text = await scrape(session, url)
        if metric(text, name, **labels) == value or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.05)
