"""Proxy overhead benchmark (not a test): direct-to-engine vs through `pdctl proxy`, side by side.

Two phases against fake engines (one process serving a prefill and a decode port, registering over
ZMQ like vLLM's G2 heartbeat):
  latency     64 concurrent closed-loop streams, one chunk every 20 ms: TTFT direct vs through each proxy
  efficiency  64 concurrent closed-loop streams, chunks as fast as possible: relayed SSE chunks per
              CPU-second of the proxy process (from /proc/PID/stat), and errors

    .venv/bin/python benchmarks/proxy_overhead.py [--toy-proxy PATH --toy-python PYTHON] [--json FILE]

``--toy-proxy`` points at a local copy of vLLM's moriio_toy_proxy_server.py (never committed here);
it binds ZMQ port 36367, so only one toy run at a time. Results go to stdout as a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import zmq
import zmq.asyncio
from aiohttp import web

from pd_runtime import eventloop
from pd_runtime.localports import free_port
from pd_runtime.protocol import Registration, g2_payload

CONCURRENCY = 64
TOY_REGISTRATION = "tcp://127.0.0.1:36367"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# Fake engines (subcommand "engine")
# ---------------------------------------------------------------------------------------------


def _chunk(request_id: str, index: int) -> bytes:
    """A vLLM-shaped completion chunk (the id embeds X-Request-Id, as vLLM's does)."""
    document = {
        "id": f"cmpl-{request_id}-0-0a1b2c3d",
        "object": "text_completion",
        "created": 1764403200,
        "model": "bench-model",
        "choices": [{"index": 0, "text": f" tok{index}", "logprobs": None, "finish_reason": None}],
        "usage": None,
    }
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


async def _prefill(request: web.Request) -> web.Response:
    body = await request.json()
    params = body.get("kv_transfer_params") or {}
    return web.json_response(
        {
            "id": "cmpl-x",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "kv_transfer_params": {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [1, 2, 3],
                "remote_engine_id": "127.0.0.1:6301",
                "remote_host": "127.0.0.1",
                "remote_handshake_port": "6301",
                "remote_notify_port": "6105",
                "remote_dp_size": 1,
                "tp_size": 1,
                "transfer_id": params.get("transfer_id"),
            },
        }
    )


async def _decode(request: web.Request) -> web.StreamResponse:
    """Streams ``max_tokens`` chunks, ``bench_interval_ms`` apart (0: yield only between chunks)."""
    body = await request.json()
    count = int(body.get("max_tokens", 16))
    interval = float(body.get("bench_interval_ms", 0)) / 1000
    request_id = request.headers.get("X-Request-Id", "direct")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for index in range(count):
        await response.write(_chunk(request_id, index))
        await asyncio.sleep(interval)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _run_engines(prefill_port: int, decode_port: int, registration: list[str]) -> None:
    runners = []
    for port, handler in ((prefill_port, _prefill), (decode_port, _decode)):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_get("/health", _health)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        runners.append(runner)
    context = zmq.asyncio.Context()
    sockets = []
    for address in registration:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sockets.append(sock)
    instances = [
        Registration("P", "127.0.0.1", prefill_port, 6301, 6105, 1, 1, "WRITE", "G2"),
        Registration("D", "127.0.0.1", decode_port, 7301, 7501, 1, 1, "WRITE", "G2"),
    ]
    payloads = [msgpack.packb(g2_payload(instance)) for instance in instances]
    while True:  # the G2 heartbeat: every 3 s
        for sock in sockets:
            for payload in payloads:
                await sock.send(payload)
        await asyncio.sleep(3)


# ---------------------------------------------------------------------------------------------
# Load generator
# ---------------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    target: str
    phase: str
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    seconds: float = 0.0
    proxy_cpu_s: float | None = None
    ttft_ms: list[float] = field(default_factory=list)

    def add(self, other: PhaseResult) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.chunks += other.chunks
        self.seconds += other.seconds
        if other.proxy_cpu_s is not None:
            self.proxy_cpu_s = (self.proxy_cpu_s or 0.0) + other.proxy_cpu_s
        self.ttft_ms.extend(other.ttft_ms)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("ttft_ms")
        if self.ttft_ms:
            ordered = sorted(self.ttft_ms)
            data["ttft_p50_ms"] = statistics.median(ordered)
            data["ttft_p99_ms"] = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        if self.proxy_cpu_s:
            data["chunks_per_cpu_s"] = self.chunks / self.proxy_cpu_s
        data["chunks_per_s"] = self.chunks / self.seconds if self.seconds else 0.0
        return data


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


async def _one_stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], result: PhaseResult) -> None:
    started = time.perf_counter()
    first: float | None = None
    received = b""
    try:
        async with session.post(url, json=body) as resp:
            async for data in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                received += data
            ok = resp.status == 200 and received.endswith(b"data: [DONE]\n\n")
    except aiohttp.ClientError:
        ok = False
    result.requests += 1
    if not ok or first is None:
        result.errors += 1
        return
    result.chunks += received.count(b"\n\n") - 1  # every event but [DONE]
    result.ttft_ms.append(1000 * (first - started))


async def run_phase(
    target: str, url: str, phase: str, body: dict[str, Any], seconds: float, proxy_pid: int | None, concurrency: int
) -> PhaseResult:
    stagger_s = int(body["max_tokens"]) * float(body.get("bench_interval_ms", 0)) / 1000
    result = PhaseResult(target, phase)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await _one_stream(session, url, body, PhaseResult(target, "warmup"))
        cpu_before = cpu_seconds(proxy_pid) if proxy_pid else None
        started = time.perf_counter()
        deadline = started + seconds

        async def client(index: int) -> None:
            # Staggered starts: in steady state 64 live streams begin at different moments, not in waves.
            await asyncio.sleep(stagger_s * index / concurrency)
            while time.perf_counter() < deadline:
                await _one_stream(session, url, body, result)

        await asyncio.gather(*(client(i) for i in range(concurrency)))
        result.seconds = time.perf_counter() - started
        if proxy_pid and cpu_before is not None:
            result.proxy_cpu_s = cpu_seconds(proxy_pid) - cpu_before
    return result


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------


async def _wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": "bench-model", "prompt": "hi", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(url, json=body) as resp:
                    if resp.status == 200:
                        await resp.read()
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never became ready")


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


async def main_async(args: argparse.Namespace) -> list[PhaseResult]:
    prefill_port, decode_port = free_port(), free_port()
    registrations = {loop: f"tcp://127.0.0.1:{free_port()}" for loop in args.loops}
    addresses = [*registrations.values()] + ([TOY_REGISTRATION] if args.toy_proxy else [])
    procs = [
        _spawn([sys.executable, __file__, "engine", str(prefill_port), str(decode_port), *addresses]),
    ]
    targets: list[tuple[str, str, int | None]] = [("direct", f"http://127.0.0.1:{decode_port}/v1/completions", None)]
    for loop, registration in registrations.items():
        port = free_port()
        proc = _spawn(
            [sys.executable, "-m", "pd_runtime.cli", "proxy", "--port", str(port), "--admin-port", str(free_port()),
             "--registration-address", registration, "--transfer-mode", "write", "--loop", loop]
        )  # fmt: skip
        procs.append(proc)
        targets.append((f"pdctl proxy ({loop})", f"http://127.0.0.1:{port}/v1/completions", proc.pid))
    if args.toy_proxy:
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(args.toy_proxy).parent)}
        proc = _spawn([args.toy_python, args.toy_proxy, "--port", str(port)], env=env)
        procs.append(proc)
        targets.append(("vLLM toy proxy", f"http://127.0.0.1:{port}/v1/completions", proc.pid))
    results: list[PhaseResult] = []
    try:
        for _, url, _ in targets:
            await _wait_ready(url)
        live = {"model": "bench-model", "prompt": "hi", "max_tokens": args.live_chunks, "stream": True,
                "bench_interval_ms": 20}  # fmt: skip
        fast = {"model": "bench-model", "prompt": "hi", "max_tokens": args.fast_chunks, "stream": True}
        # Rounds interleave the targets, so background load on a shared machine hits all of them alike.
        for phase, body, phase_targets in (("latency", live, targets), ("efficiency", fast, targets[1:])):
            merged: dict[str, PhaseResult] = {}
            for _ in range(args.rounds):
                for name, url, pid in phase_targets:
                    part = await run_phase(name, url, phase, body, args.seconds / args.rounds, pid, args.concurrency)
                    merged.setdefault(name, PhaseResult(name, phase)).add(part)
            results.extend(merged.values())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:  # the toy proxy ignores SIGTERM
                proc.kill()
                proc.wait()
    return results


def machine_line(load_before: float) -> str:
    import platform
    from importlib.metadata import version

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f"Measured on: {platform.machine()}, {os.cpu_count()} CPUs, load average {load_before:.2f} at start and "
        f"{os.getloadavg()[0]:.2f} at end, Python {platform.python_version()}, aiohttp {version('aiohttp')}, "
        f"{eventloop.loop_name()}; {when}."
    )


def render(results: list[PhaseResult], concurrency: int) -> str:
    direct = next(r.summary() for r in results if r.target == "direct")
    lines = [
        f"Latency: {concurrency} concurrent streams, one chunk every 20 ms (TTFT at the client)",
        "",
        "| target | requests | errors | TTFT p50 ms | TTFT p99 ms | added p50 ms | added p99 ms "
        "| chunks per proxy CPU-s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in (r.summary() for r in results if r.phase == "latency"):
        lines.append(
            f"| {r['target']} | {r['requests']} | {r['errors']} | {r['ttft_p50_ms']:.2f} | {r['ttft_p99_ms']:.2f} "
            f"| {r['ttft_p50_ms'] - direct['ttft_p50_ms']:+.2f} | {r['ttft_p99_ms'] - direct['ttft_p99_ms']:+.2f} "
            f"| {r.get('chunks_per_cpu_s', 0):.0f} |"
        )
    lines += [
        "",
        f"Efficiency: {concurrency} closed-loop streams, chunks as fast as possible",
        "",
        "| target | requests | errors | relayed chunks | chunks/s | proxy CPU s | chunks per proxy CPU-second |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in (r.summary() for r in results if r.phase == "efficiency"):
        lines.append(
            f"| {r['target']} | {r['requests']} | {r['errors']} | {r['chunks']} | {r['chunks_per_s']:.0f} "
            f"| {r['proxy_cpu_s']:.2f} | {r.get('chunks_per_cpu_s', 0):.0f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="concurrent closed-loop streams")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each phase per target")
    parser.add_argument("--rounds", type=int, default=4, help="each phase's time is split into this many rounds")
    parser.add_argument("--live-chunks", type=int, default=25, help="chunks per stream in the latency phase")
    parser.add_argument("--fast-chunks", type=int, default=200, help="chunks per stream in the efficiency phase")
    parser.add_argument("--loops", nargs="+", default=["uvloop", "asyncio"], choices=("uvloop", "asyncio"))
    parser.add_argument("--toy-proxy", default=None, help="path to a local moriio_toy_proxy_server.py")
    parser.add_argument("--toy-python", default=sys.executable, help="python with quart and hypercorn")
    parser.add_argument("--json", default=None, help="also write the summaries to this file")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "engine":
        prefill_port, decode_port, *registration = argv[1:]
        eventloop.run(_run_engines(int(prefill_port), int(decode_port), registration))
        return 0
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    results = eventloop.run(main_async(args))
    sys.stdout.write(machine_line(load_before) + "\n\n" + render(results, args.concurrency))
    if args.json:
        Path(args.json).write_text(json.dumps([r.summary() for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
