"""One rendered PDDeployment brought up on loopback: the real `pdctl proxy` and recording engines.

The spec is an example with free ports; the pod is rendered by our render API; the proxy runs the
rendered proxy command (``--host`` moved to 127.0.0.1); each engine's connector is built by vLLM from
the rendered ``vllm serve`` argv, and its registration is sent by vLLM's own connector worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conformance.engines import Behaviour, EngineRole, Ledger, RecordingEngine
from conformance.rendered import disaggregated_spec, engine_cases_of, example_spec, kubelet_command, pod_of
from conformance.vllm_code import parse_serve, registering_worker, vllm_config
from pd_operator.command_lines import proxy_settings
from pd_operator.validation import validate_spec


@dataclass
class Deployment:
    proxy_url: str
    admin_url: str
    engines: dict[EngineRole | str, RecordingEngine]
    registrations: list[dict[str, Any]]
    proxy_log: Path

    def legs(self, role: EngineRole) -> list[Any]:
        return [leg for engine in self.engines.values() if engine.role == role for leg in engine.legs]

    async def settle(self, timeout: float) -> None:
        """Wait (bounded) until every decode leg has ended: answered, closed, or judged.

        The proxy may answer its client a moment before its close of a decode leg reaches the engine.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and any(
            not (leg.answered or leg.closed_by_proxy or leg.violations) for leg in self.legs("decode")
        ):
            await asyncio.sleep(0.02)


# Below Linux's ephemeral range (32768-60999), where admission wants the side channels (vLLM binds them late).
PORT_RANGE = (20000, 32000)


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1 in PORT_RANGE (held open together while chosen)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for port in random.sample(range(*PORT_RANGE), 200):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports in {PORT_RANGE}")


def _spec(mode: str) -> dict[str, Any]:
    """An example with free ports (TP1/DP1 engines: each side channel reserves one port)."""
    ports = distinct_free_ports(9)
    if mode == "colocated":
        spec = example_spec("qwen3-235b-colocated.yaml")
        for engine, port in zip(spec["colocated"]["engines"], ports, strict=False):
            engine["port"] = port
    else:
        spec = disaggregated_spec(
            mode,
            prefill_shape=(1, 1),
            decode_shape=(1, 1),
            prefill_ports=tuple(ports[:3]),
            decode_ports=tuple(ports[3:6]),
        )
    spec.setdefault("proxy", {}).update(registrationPort=ports[6], port=ports[7], adminPort=ports[8])
    return spec


def _proxy_argv(pod: dict[str, Any], settings_file: Path) -> list[str]:
    command = kubelet_command(next(c for c in pod["spec"]["containers"] if c["name"] == "proxy"))
    assert command[:2] == ["pdctl", "proxy"]  # its --expected-engine flags name the engines' $(POD_IP)
    argv = list(command[2:])
    argv[argv.index("--host") + 1] = "127.0.0.1"  # loopback only on this machine
    argv[argv.index("--config-file") + 1] = str(settings_file)  # the rendered ConfigMap's file, written here
    return [sys.executable, "-m", "pd_runtime.cli", "proxy", *argv]


async def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"pdctl proxy exited {proc.returncode}:\n{log.read_text()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url + "/ready") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"proxy not ready in {timeout_s} s:\n{log.read_text()}")


@contextlib.asynccontextmanager
async def deployment(
    mode: str, behaviour: Behaviour, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[Deployment]:
    spec = validate_spec(_spec(mode))
    pod = pod_of(spec)
    cases = {case.name.rsplit("/", 1)[1]: case for case in engine_cases_of([pod], "flow")}
    payloads: list[dict[str, Any]] = []
    ledger = Ledger()
    engines: dict[EngineRole | str, RecordingEngine] = {}
    log = tmp_path / "proxy.log"
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(log.open("wb"))
        settings_file = tmp_path / "proxy.json"
        settings_file.write_text(json.dumps(proxy_settings(spec)))
        proc = subprocess.Popen(_proxy_argv(pod, settings_file), stdout=handle, stderr=subprocess.STDOUT)
        stack.callback(_stop, proc)
        peer_zmq: dict[EngineRole, str] = {}
        for name, case in cases.items():
            parsed = parse_serve(case.serve_args)
            role: EngineRole = "engine" if parsed.kv_transfer is None else name  # type: ignore[assignment]
            config = None if parsed.kv_transfer is None else vllm_config(parsed.kv_transfer, 1, 1)
            engine = RecordingEngine(role, config, parsed.args.port, ledger, behaviour, peer_zmq)
            notify = None if config is None else int(parsed.kv_transfer.kv_connector_extra_config["notify_port"])  # type: ignore[union-attr]
            await engine.start(notify)
            engines[name] = engine
            if config is not None:
                stack.enter_context(registering_worker(config, monkeypatch, payloads))
        expected = {"P" if e.role == "prefill" else "D" for e in engines.values() if e.role != "engine"}
        await _until_registered(payloads, expected)
        for payload in payloads:
            peer_zmq["prefill" if payload["type"] == "P" else "decode"] = payload["zmq_address"]
        proxy_url = f"http://127.0.0.1:{spec.proxy.port}"
        try:
            await _wait_ready(proxy_url, proc, log)
            yield Deployment(proxy_url, f"http://127.0.0.1:{spec.proxy.admin_port}", engines, payloads, log)
        finally:
            for engine in engines.values():
                await engine.stop()


async def _until_registered(payloads: list[dict[str, Any]], roles: set[str], timeout_s: float = 10.0) -> None:
    """vLLM's heartbeat thread sends its first registration shortly after the worker starts."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not roles <= {p["type"] for p in payloads}:
        if loop.time() > deadline:
            raise TimeoutError(f"no registration from {roles} within {timeout_s} s: {payloads}")
        await asyncio.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
