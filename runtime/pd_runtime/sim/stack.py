"""A local deployment of real processes: `pdctl proxy` plus simulated engines, on loopback.

Used by the end-to-end tests and by benchmarks/calibrate_sim.py to run the seed's configurations as real
processes (HTTP, ZMQ registration, ZMQ side channels) in scaled time. Every process is started here
and stopped here, by pid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from pd_runtime.localports import PortReservation
from pd_runtime.sim.system import EngineShape, Topology

log = logging.getLogger(__name__)

MODEL = "sim-model"


@dataclass
class LocalStack:
    proxy_url: str
    admin_url: str
    engine_urls: dict[str, str]
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)
    ports: PortReservation = field(default_factory=PortReservation)
    """The stack's ports, held until ``stop``: its processes join them, and one killed keeps its port."""

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the proxy says ready (>= 1 live P and D, or an engine in colocated mode)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                self._check_alive()
                try:
                    async with session.get(self.proxy_url + "/ready") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"proxy at {self.proxy_url} not ready within {timeout_s} s")
                await asyncio.sleep(0.2)

    def _check_alive(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")

    def kill(self, name: str) -> None:
        """SIGKILL one process (an engine dying mid-run: no goodbye on any socket)."""
        proc = self._procs[name]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        self.ports.release()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for handle in self._logs:
            handle.close()


def _pdctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "pd_runtime.cli", *args]


def _engine_args(shape: EngineShape, port: int, profile: str, time_scale: float) -> list[str]:
    """The flags of the operator's command line that change the simulation (its ``mp`` executor: an idle
    prefill reaps an expired deferred send, docs/vllm-versions.md#deferred-send-reaping)."""
    return [
        MODEL, "-tp", str(shape.tp), "--port", str(port), "--host", "127.0.0.1",
        "--max-num-batched-tokens", str(shape.max_batched_tokens), "--max_num_seqs", str(shape.max_num_seqs),
        "--distributed-executor-backend", "mp", "--profile", profile, "--time-scale", f"{time_scale:g}",
    ]  # fmt: skip


def _kv_config(
    role: str, port: int, handshake: int, notify: int, registration: int, read: bool, keys: Mapping[str, Any]
) -> str:
    extra = {
        "proxy_ip": "127.0.0.1",
        "proxy_ping_port": str(registration),
        "http_port": str(port),
        "handshake_port": str(handshake),
        "notify_port": str(notify),
        "host_ip": "127.0.0.1",
    }
    if read:
        extra["read_mode"] = "true"
    config = {"kv_connector": "MoRIIOConnector", "kv_role": role, "kv_connector_extra_config": extra, **keys}
    return json.dumps(config)


def _instance(role: str, index: int, count: int) -> str:
    """Engine names as the operator gives containers: prefill alone, prefill-0, prefill-1 with several."""
    return role if count == 1 else f"{role}-{index}"


def launch(
    topology: Topology,
    profile: str,
    time_scale: float,
    log_dir: Path,
    extra_engine_args: tuple[str, ...] = (),
    extra_proxy_args: tuple[str, ...] = (),
    role_args: Mapping[str, tuple[str, ...]] | None = None,
    kv_transfer_keys: Mapping[str, Any] | None = None,
) -> LocalStack:
    """Start the proxy and the engines of ``topology``; call ``wait_ready`` before sending traffic.
    ``role_args`` adds arguments to the engines of one role ("prefill", "decode"); ``kv_transfer_keys``
    adds top-level keys to every engine's --kv-transfer-config (e.g. ``kv_load_failure_policy``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = PortReservation()
    api, admin, registration = ports.port(), ports.port(), ports.port()
    stack = LocalStack(f"http://127.0.0.1:{api}", f"http://127.0.0.1:{admin}", {}, ports=ports)
    commands: dict[str, list[str]] = {}
    proxy = ["proxy", "--host", "127.0.0.1", "--port", str(api), "--admin-port", str(admin),
             "--registration-address", f"tcp://127.0.0.1:{registration}", "--log-level", "WARNING"]  # fmt: skip
    if topology.kind == "colocated":
        for index in range(topology.engines):
            port = ports.port()
            commands[f"engine-{index}"] = _pdctl(
                "sim-engine", *_engine_args(topology.engine, port, profile, time_scale), *extra_engine_args
            )
            stack.engine_urls[f"engine-{index}"] = f"http://127.0.0.1:{port}"
            proxy += ["--engine", stack.engine_urls[f"engine-{index}"]]
        proxy += ["--mode", "colocated"]
    else:
        read = topology.kind == "read"
        roles = (
            *(
                (_instance("prefill", i, topology.prefills), "kv_producer", topology.prefill)
                for i in range(topology.prefills)
            ),
            *(
                (_instance("decode", i, topology.decodes), "kv_consumer", topology.decode)
                for i in range(topology.decodes)
            ),
        )
        for name, role, shape in roles:
            port, handshake, notify = ports.port(), ports.block(shape.tp), ports.block(shape.tp)
            kv = _kv_config(role, port, handshake, notify, registration, read, kv_transfer_keys or {})
            commands[name] = _pdctl(
                "sim-engine", *_engine_args(shape, port, profile, time_scale), "--kv-transfer-config", kv,
                *extra_engine_args, *(role_args or {}).get(name.split("-")[0], ()),
            )  # fmt: skip
            stack.engine_urls[name] = f"http://127.0.0.1:{port}"
        proxy += ["--mode", "disaggregated", "--transfer-mode", topology.kind]
        proxy += ["--decode-max-in-flight", str(topology.decode.max_num_seqs)]  # as the operator renders it
    proxy += list(extra_proxy_args)
    commands = {"proxy": _pdctl(*proxy), **commands}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name, argv in commands.items():
        handle = (log_dir / f"{name}.log").open("wb")
        stack._logs.append(handle)
        stack._procs[name] = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
        log.info("started %s (pid %d)", name, stack._procs[name].pid)
    return stack
