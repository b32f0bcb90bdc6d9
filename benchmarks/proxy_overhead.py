"""Proxy overhead benchmark (not a test): direct-to-engine vs through each proxy, side by side, CPUs pinned.

The proxy under test runs alone on its own CPU; the load generator (this process) and the fake engines
share the other one, in every run, direct included, so a proxy's cost is not hidden by or blamed on
the processes around it. The fake engines are a minimal HTTP/1.1 server on asyncio protocols (one
process: a prefill port answering at once with ``kv_transfer_params``, a decode port streaming
vLLM-shaped completion chunks whose ``id`` embeds the X-Request-Id and whose ``bench_sent_ns`` is the
monotonic clock at the write), registering over ZMQ like vLLM's G2 heartbeat.

Scenarios: closed-loop streams of ``--chunks`` chunks, one every 20 ms (paced), at each ``--streams``
count, with staggered starts (steady state) and all-at-once starts (waves); saturated streams (chunks as
fast as the engine writes them) at each count; with ``--burst N`` a wave of N paced streams starting
together. Each target gets the same windows, interleaved in rounds so the machine's background load hits
all alike. Reported per target: TTFT p50/p99 at the client, the gap between chunks (ITL) and each
chunk's delivery latency (engine write to client read), requests per second, the proxy's CPU per relayed
chunk (a chunk is one SSE event counted at the client) and per request, its resident memory, and at the
end one summary table of every scenario.

    .venv/bin/python benchmarks/proxy_overhead.py [--vllm-router VENV] [--toy-proxy PATH --toy-python PYTHON]
        [--compare "NAME=PYTHON" ...] [--json FILE] [--profile-with PY_SPY --profile-dir DIR]

``--vllm-router`` runs vLLM's own P/D router (the venv of ``benchmarks/router_venv.sh``) beside ours, in
MoRI-IO discovery mode against the same fake engines, with the round-robin policy (its default,
cache_aware, first renders the prompt on both engines: two more upstream requests per client request).

``--toy-proxy`` points at a local copy of vLLM's moriio_toy_proxy_server.py (never committed here); it
binds ZMQ port 36367, so only one toy run at a time. ``--compare`` adds `pdctl proxy` from another
installation (e.g. a worktree of the previous commit with its own venv). Results go to stdout as
Markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import zmq
import zmq.asyncio

from pd_runtime import eventloop
from pd_runtime.localports import PortReservation
from pd_runtime.protocol import Registration, g2_payload

TOY_REGISTRATION = "tcp://127.0.0.1:36367"
PACE_MS = 20.0
LOAD_SAMPLES: list[float] = []  # the 1-minute load average as each window starts
LOAD_CPU, PROXY_CPU = 0, 1


# ---------------------------------------------------------------------------------------------
# Fake engines (subcommand "engine"): HTTP/1.1 on asyncio protocols, so they cost next to nothing
# ---------------------------------------------------------------------------------------------

_CHUNK = (
    b'data: {"id":"cmpl-%s-0-0a1b2c3d","object":"text_completion","created":1764403200,"model":"bench-model",'
    b'"choices":[{"index":0,"text":" tok%d","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":%s,"token_ids":%s}],"usage":null,"bench_sent_ns":%d}\n\n'
)
"""A completion chunk as vLLM writes it: the token ids are null unless the request asked for them
(``return_token_ids``, which our proxy sets on a stream it may migrate); then the first chunk carries the
prompt's ids and every chunk its token's."""
_PROMPT_IDS = b"[%s]" % b",".join(b"%d" % (1000 + i) for i in range(32))
_STAMP = b'"bench_sent_ns":'


def _prefill_template() -> bytes:
    """Prefill's answer with a placeholder for the transfer id: the fake prefill only fills it in, so the
    proxy's second request costs the engines' CPU (shared with the load generator) next to nothing."""
    return json.dumps(
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
                "transfer_id": "TRANSFER_ID",
            },
        }
    ).encode()


_PREFILL = _prefill_template()
_TRANSFER_ID = re.compile(rb'"transfer_id":\s*"([^"]*)"')


class FakeEngine(asyncio.Protocol):
    """One keep-alive connection: POST answers like prefill (JSON) or decode (SSE stream), GET is 200."""

    def __init__(self, decode: bool) -> None:
        self.decode = decode
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.streaming: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no subclass)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (request := self._next_request()) is not None:
            self._answer(*request)

    def _next_request(self) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buffer[:end].split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get(b"content-length", b"0"))
        if len(self.buffer) < end + 4 + length:
            return None
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        return lines[0].split(b" ", 1)[0], headers, body

    def _answer(self, method: bytes, headers: dict[bytes, bytes], body: bytes) -> None:
        assert self.transport is not None
        if method != b"POST":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            return
        if not self.decode:
            found = _TRANSFER_ID.search(body)
            answer = _PREFILL.replace(b"TRANSFER_ID", found.group(1) if found else b"")
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(answer), answer)
            )
            return
        document = json.loads(body)
        request_id = headers.get(b"x-request-id", b"direct")
        count = int(document.get("max_tokens", 16))
        interval = float(document.get("bench_interval_ms", 0)) / 1000
        ids = document.get("return_token_ids") is True
        self.streaming = asyncio.get_running_loop().create_task(self._stream(request_id, count, interval, ids))

    async def _stream(self, request_id: bytes, count: int, interval: float, ids: bool) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for index in range(count):
            prompt_ids = _PROMPT_IDS if ids and index == 0 else b"null"
            token_ids = b"[%d]" % (2000 + index) if ids else b"null"
            event = _CHUNK % (request_id, index, prompt_ids, token_ids, time.monotonic_ns())
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(interval)
            await self.writable.wait()
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def _run_engines(prefill_port: int, decode_port: int, registration: list[str]) -> None:
    loop = asyncio.get_running_loop()
    for port, decode in ((prefill_port, False), (decode_port, True)):
        await loop.create_server(lambda d=decode: FakeEngine(d), "127.0.0.1", port, backlog=4096)  # type: ignore[misc]
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


@dataclass(frozen=True)
class Scenario:
    name: str
    streams: int
    paced: bool
    staggered: bool
    burst: bool = False  # one wave of requests sent together per round, not a closed loop

    @property
    def label(self) -> str:
        """The load in words, for the summary table."""
        if self.burst:
            return f"burst of {self.streams} paced streams"
        if not self.paced:
            return f"saturated, {self.streams} streams"
        return f"paced, {self.streams} streams, {'staggered' if self.staggered else 'all at once'}"


@dataclass
class Window:
    """What one target did in one scenario (all its rounds merged)."""

    target: str
    scenario: str
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    seconds: float = 0.0
    proxy_cpu_s: float | None = None
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    delivery_ms: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    streams: int = 0
    span: tuple[int, int] = (0, 0)  # monotonic ns; nothing counts outside it
    round_ttft_p50_ms: list[float] = field(default_factory=list)  # each round's own p50 (the spread)
    rss_kib: int = 0  # the proxy's resident memory at the window's end (the largest of the rounds)
    load: list[float] = field(default_factory=list)  # the 1-minute load average as each round's window starts

    def add(self, other: Window) -> None:
        if other.ttft_ms:
            self.round_ttft_p50_ms.append(statistics.median(other.ttft_ms))
        self.rss_kib = max(self.rss_kib, other.rss_kib)
        self.load.extend(other.load)
        self.requests += other.requests
        self.errors += other.errors
        self.chunks += other.chunks
        self.seconds += other.seconds
        if other.proxy_cpu_s is not None:
            self.proxy_cpu_s = (self.proxy_cpu_s or 0.0) + other.proxy_cpu_s
        self.ttft_ms.extend(other.ttft_ms)
        self.itl_ms.extend(other.itl_ms)
        self.delivery_ms.extend(other.delivery_ms)
        self.duration_s.extend(other.duration_s)
        self.streams = other.streams

    def summary(self) -> dict[str, Any]:
        skip = ("span", "duration_s", "ttft_ms", "itl_ms", "delivery_ms")
        data = {k: v for k, v in asdict(self).items() if k not in skip}
        for name in ("ttft_ms", "itl_ms", "delivery_ms"):
            samples = sorted(getattr(self, name))
            if samples:
                data[f"{name[:-3]}_p50_ms"] = statistics.median(samples)
                data[f"{name[:-3]}_p99_ms"] = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
        # Closed loop without think time: throughput is streams / mean request time (Little's law), which
        # does not depend on where the waves of all-at-once starts fall relative to the window.
        data["requests_per_s"] = self.streams / statistics.fmean(self.duration_s) if self.duration_s else 0.0
        data["chunks_per_s"] = self.chunks / self.seconds if self.seconds else 0.0
        if self.proxy_cpu_s:
            data["chunks_per_cpu_s"] = self.chunks / self.proxy_cpu_s
            if self.chunks:
                data["cpu_us_per_chunk"] = 1e6 * self.proxy_cpu_s / self.chunks
            if self.requests:
                data["cpu_us_per_request"] = 1e6 * self.proxy_cpu_s / self.requests
        return data


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads, in nanoseconds' resolution (``/proc/PID/stat`` counts clock
    ticks of 10 ms, too coarse for a window of a few thousand requests): each thread's time on a CPU from
    its schedstat. A thread that ends inside a window takes its time with it (the proxies keep theirs)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def rss_kib(pid: int) -> int:
    """VmRSS of a process (all its threads share it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _stamps(data: bytes) -> Iterator[int]:
    """The engine's write times of the events in one read."""
    start = data.find(_STAMP)
    while start >= 0:
        start += len(_STAMP)
        end = data.index(b"}", start)
        yield int(data[start:end])
        start = data.find(_STAMP, end)


async def _one_stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], window: Window) -> None:
    """One request. Inside the window (monotonic ns ``window.span``) count: its events read there, its
    completion there (requests per second) and, when it started there, its latencies."""
    begin, end = window.span
    paced = bool(body.get("bench_interval_ms"))
    started = time.monotonic_ns()
    first = last = events = 0
    gaps: list[float] = []
    delivery: list[float] = []
    tail = b""
    try:
        async with session.post(url, json=body) as resp:
            async for data in resp.content.iter_any():
                now = time.monotonic_ns()
                if not first:
                    first = now
                elif paced:
                    gaps.append((now - last) / 1e6)
                last = now
                if begin <= now < end:
                    events += data.count(b"\n\n")
                if paced:
                    delivery.extend((now - sent) / 1e6 for sent in _stamps(data))
                tail = (tail + data)[-16:]
            ok = resp.status == 200 and tail.endswith(b"data: [DONE]\n\n")
    except aiohttp.ClientError:
        ok = False
    finished = time.monotonic_ns()
    if ok and begin <= finished < end:
        events -= 1  # [DONE] is not a chunk
    window.chunks += max(0, events)
    if begin <= finished < end:
        window.requests += 1
        window.errors += 0 if ok and first else 1
    if ok and first and begin <= started < end:
        window.ttft_ms.append((first - started) / 1e6)
        window.itl_ms.extend(gaps)
        window.delivery_ms.extend(delivery)
        window.duration_s.append((finished - started) / 1e9)


async def run_window(
    target: str, url: str, scenario: Scenario, body: dict[str, Any], seconds: float, proxy_pid: int | None
) -> Window:
    """Closed-loop streams; the window opens after one request's duration (staggered starts have all begun)."""
    request_s = int(body["max_tokens"]) * float(body.get("bench_interval_ms", 0)) / 1000
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await _one_stream(session, url, {**body, "max_tokens": 2}, Window(target, "warmup"))  # connections up
        begin = time.monotonic() + request_s
        end = begin + seconds
        span = (int(begin * 1e9), int(end * 1e9))
        window = Window(target, scenario.name, seconds=seconds, streams=scenario.streams, span=span)

        async def client(index: int) -> None:
            if scenario.staggered:
                await asyncio.sleep(request_s * index / scenario.streams)
            while time.monotonic() < end:
                await _one_stream(session, url, body, window)

        async def meter() -> None:
            await asyncio.sleep(max(0.0, begin - time.monotonic()))
            before = cpu_seconds(proxy_pid) if proxy_pid else None
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            if proxy_pid and before is not None:
                window.proxy_cpu_s = cpu_seconds(proxy_pid) - before
                window.rss_kib = rss_kib(proxy_pid)

        await asyncio.gather(meter(), *(client(i) for i in range(scenario.streams)))
    return window


async def run_burst(target: str, url: str, scenario: Scenario, body: dict[str, Any], proxy_pid: int | None) -> Window:
    """``scenario.streams`` requests sent together, once, on warm connections: a first, unmeasured wave
    opens the client's connections and the proxy's upstream pools, the second is measured whole (every
    request's latencies, the proxy's CPU from the first request out to the last answer in)."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        warm = Window(target, "warmup", span=(0, 0))
        await asyncio.gather(*(_one_stream(session, url, body, warm) for _ in range(scenario.streams)))
        began = time.monotonic()
        before = cpu_seconds(proxy_pid) if proxy_pid else None
        window = Window(target, scenario.name, streams=scenario.streams, span=(int(began * 1e9), 2**63))
        await asyncio.gather(*(_one_stream(session, url, body, window) for _ in range(scenario.streams)))
        window.seconds = time.monotonic() - began
        if proxy_pid and before is not None:
            window.proxy_cpu_s = cpu_seconds(proxy_pid) - before
            window.rss_kib = rss_kib(proxy_pid)
    return window


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


def _spawn(argv: list[str], cpu: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process pinned to one CPU (its threads inherit the affinity)."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


async def _wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": "bench-model", "prompt": "hi", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(url, json=body) as resp:
                    if resp.status == 200:
                        await resp.read()
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never became ready")


def _pdctl_proxy(name: str, command: list[str], loop: str, registration: str, ports: PortReservation) -> Target:
    """`pdctl proxy` (or a program taking its flags) with its defaults, in write mode."""
    port = ports.port()
    argv = [*command, "--port", str(port), "--admin-port", str(ports.port()),
            "--registration-address", registration, "--transfer-mode", "write", "--loop", loop]  # fmt: skip
    return Target(f"{name} ({loop})", f"http://127.0.0.1:{port}/v1/completions", _spawn(argv, PROXY_CPU))


def _vllm_router(venv: str, discovery: str, ports: PortReservation) -> Target:
    """vLLM's own P/D router in MoRI-IO mode. It takes MoRI-IO engines only from their ZMQ heartbeats (it
    refuses static URLs for MoRI-IO), so the fake engines register with it as with ours; round robin,
    like ours by default (its default, cache_aware, renders the prompt on both engines before the legs)."""
    port = ports.port()
    argv = [f"{venv}/bin/vllm-router", "--host", "127.0.0.1", "--port", str(port), "--vllm-pd-disaggregation",
            "--kv-connector", "moriio", "--vllm-discovery-address", discovery.removeprefix("tcp://"),
            "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(ports.port())]  # fmt: skip
    name = f"vllm-router {router_version(venv)}"
    return Target(name, f"http://127.0.0.1:{port}/v1/completions", _spawn(argv, PROXY_CPU))


def router_version(venv: str) -> str:
    script = "from importlib.metadata import version; print(version('vllm-router'))"
    found = subprocess.run([f"{venv}/bin/python", "-c", script], check=True, capture_output=True, text=True)
    return found.stdout.strip()


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    paced = [
        Scenario(f"{n} streams, {'staggered' if staggered else 'all at once'}", n, True, staggered)
        for n in args.streams
        for staggered in (True, False)
    ]
    saturated = [Scenario(f"{n} streams, saturated", n, False, False) for n in args.streams]
    burst = [Scenario(f"{args.burst} streams, burst", args.burst, True, False, burst=True)] if args.burst else []
    every = [*paced, *saturated, *burst]
    return [s for s in every if not args.only or any(only in s.name for only in args.only)]


@contextlib.contextmanager
def profiling(args: argparse.Namespace, target: Target, scenario: Scenario) -> Iterator[None]:
    """py-spy flame graph of one proxy over one window (profile runs only: sampling costs CPU)."""
    if not args.profile_with or target.pid is None:
        yield
        return
    stem = f"{target.name}-{scenario.name}".replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
    out = Path(args.profile_dir) / f"{stem}.{'svg' if args.profile_format == 'flamegraph' else 'txt'}"
    spy = subprocess.Popen(
        [args.profile_with, "record", "--pid", str(target.pid), "--rate", "500", "--format", args.profile_format,
         "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {LOAD_CPU}),
    )  # fmt: skip
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)


async def main_async(args: argparse.Namespace) -> list[Window]:
    ports = PortReservation()  # held until every process listens
    prefill_port, decode_port = ports.port(), ports.port()
    pdctl = [("pdctl proxy", [sys.executable, "-m", "pd_runtime.cli", "proxy"])]
    compare = (c.split("=", 1) for c in args.compare)
    pdctl += [(name, [python, "-m", "pd_runtime.cli", "proxy"]) for name, python in compare]
    if args.prototype:
        pdctl.append((Path(args.prototype).stem, [sys.executable, args.prototype]))
    registrations = {(name, loop): f"tcp://127.0.0.1:{ports.port()}" for name, _ in pdctl for loop in args.loops}
    router_discovery = f"tcp://127.0.0.1:{ports.port()}" if args.vllm_router else None
    addresses = [*registrations.values()] + ([TOY_REGISTRATION] if args.toy_proxy else [])
    addresses += [router_discovery] if router_discovery else []
    engines = _spawn([sys.executable, __file__, "engine", str(prefill_port), str(decode_port), *addresses], LOAD_CPU)
    targets = [Target("direct", f"http://127.0.0.1:{decode_port}/v1/completions")]
    for name, command in pdctl:
        targets += [_pdctl_proxy(name, command, loop, registrations[name, loop], ports) for loop in args.loops]
    if args.vllm_router and router_discovery:
        targets.append(_vllm_router(args.vllm_router, router_discovery, ports))
    if args.go_relay:
        port = ports.port()
        argv = [args.go_relay, "--port", str(port), "--prefill", f"127.0.0.1:{prefill_port}",
                "--decode", f"127.0.0.1:{decode_port}"]  # fmt: skip
        relay = _spawn(argv, PROXY_CPU, env={**os.environ, "GOMAXPROCS": "1"})
        targets.append(Target("go-relay prototype", f"http://127.0.0.1:{port}/v1/completions", relay))
    if args.toy_proxy:
        port = ports.port()
        env = {**os.environ, "PYTHONPATH": str(Path(args.toy_proxy).parent)}
        toy = _spawn([args.toy_python, args.toy_proxy, "--port", str(port)], PROXY_CPU, env=env)
        targets.append(Target("vLLM toy proxy", f"http://127.0.0.1:{port}/v1/completions", toy))
    windows: list[Window] = []
    try:
        for target in targets:
            await _wait_ready(target.url)
        ports.release()
        for scenario in scenarios(args):
            body: dict[str, Any] = {"model": "bench-model", "prompt": "hi", "max_tokens": args.chunks, "stream": True}
            if scenario.paced:
                body["bench_interval_ms"] = PACE_MS
            merged: dict[str, Window] = {}
            for _ in range(args.rounds):
                for target in targets:
                    LOAD_SAMPLES.append(os.getloadavg()[0])
                    with profiling(args, target, scenario):
                        if scenario.burst:
                            part = await run_burst(target.name, target.url, scenario, body, target.pid)
                        else:
                            part = await run_window(
                                target.name, target.url, scenario, body, args.seconds / args.rounds, target.pid
                            )
                    part.load.append(LOAD_SAMPLES[-1])
                    merged.setdefault(target.name, Window(target.name, scenario.name)).add(part)
            windows.extend(merged.values())
    finally:
        procs = [engines, *(t.proc for t in targets if t.proc)]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:  # the toy proxy ignores SIGTERM
                proc.kill()
                proc.wait()
    return windows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def machine_line(load_before: float) -> str:
    import platform
    from importlib.metadata import version

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    during = f"{min(LOAD_SAMPLES, default=0):.2f} to {max(LOAD_SAMPLES, default=0):.2f}"
    return (
        f"Measured on: {platform.machine()}, {os.cpu_count()} CPUs (proxy on CPU {PROXY_CPU}, load generator and "
        f"fake engines on CPU {LOAD_CPU}), load average {load_before:.2f} at start, {during} during the windows, "
        f"{os.getloadavg()[0]:.2f} at end, Python {platform.python_version()}, aiohttp {version('aiohttp')}, "
        f"load generator on {eventloop.loop_name()}, benchmark processes {_scheduling()}; {when}."
    )


def _scheduling() -> str:
    """How the benchmark's processes (which inherit it) compete with the rest of a shared machine."""
    if os.sched_getscheduler(0) == os.SCHED_FIFO:
        return f"real-time (SCHED_FIFO priority {os.sched_getparam(0).sched_priority})"
    return f"at nice {os.nice(0)}"


def _paced_table(rows: list[dict[str, Any]]) -> list[str]:
    direct = next((r for r in rows if r["target"] == "direct"), None)
    lines = [
        "| target | requests | errors | TTFT p50 / p99 ms | added TTFT p50 / p99 ms | ITL p50 ms | added ITL p50 ms "
        "| added delivery p50 / p99 ms | requests/s | vs direct | chunks per proxy CPU-s "
        "| added TTFT p50 by round ms: median [min, max] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if direct is None or r is direct or "ttft_p50_ms" not in r:
            added = "| | | |"
            ratio = ""
        else:
            added = (
                f"| {r['ttft_p50_ms'] - direct['ttft_p50_ms']:+.2f} / {r['ttft_p99_ms'] - direct['ttft_p99_ms']:+.2f} "
                f"| {r['itl_p50_ms']:.2f} | {r['itl_p50_ms'] - direct['itl_p50_ms']:+.3f} "
                f"| {r['delivery_p50_ms'] - direct['delivery_p50_ms']:+.3f} / "
                f"{r['delivery_p99_ms'] - direct['delivery_p99_ms']:+.2f} |"
            )
            ratio = f"{100 * (r['requests_per_s'] / direct['requests_per_s'] - 1):+.1f} %"
        if r is direct:
            added = f"| | {r.get('itl_p50_ms', 0):.2f} | | |"
        cpu = f"{r['chunks_per_cpu_s']:.0f}" if r.get("chunks_per_cpu_s") else ""
        ttft = f"{r['ttft_p50_ms']:.2f} / {r['ttft_p99_ms']:.2f}" if "ttft_p50_ms" in r else "-"
        lines.append(
            f"| {r['target']} | {r['requests']} | {r['errors']} | {ttft} {added} "
            f"{r['requests_per_s']:.1f} | {ratio} | {cpu} | {_round_spread(r, direct)} |"
        )
    return lines


def _round_spread(row: dict[str, Any], direct: dict[str, Any] | None) -> str:
    """Each round's added TTFT p50 (against direct's in the same round): how much of a figure is noise."""
    if direct is None or row is direct:
        return ""
    added = sorted(a - d for a, d in zip(row["round_ttft_p50_ms"], direct["round_ttft_p50_ms"], strict=False))
    if not added:
        return ""
    return f"{statistics.median(added):+.2f} [{added[0]:+.2f}, {added[-1]:+.2f}]"


def _saturated_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| target | requests | errors | relayed chunks | chunks/s | proxy CPU s | µs proxy CPU per chunk "
        "| chunks per proxy CPU-s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["target"] == "direct":
            continue  # measured only as the summary's TTFT baseline
        per_s = r.get("chunks_per_cpu_s") or 0.0
        lines.append(
            f"| {r['target']} | {r['requests']} | {r['errors']} | {r['chunks']} | {r['chunks_per_s']:.0f} "
            f"| {r['proxy_cpu_s'] or 0:.2f} | {1e6 / per_s if per_s else 0:.2f} | {per_s:.0f} |"
        )
    return lines


def _summary_table(windows: list[Window], args: argparse.Namespace) -> list[str]:
    """Every scenario and target in one table: what the issue's comparison reads."""
    lines = [
        "| load | target | requests | errors | TTFT p50 / p99 ms | added TTFT p50 / p99 ms "
        "| added TTFT p50 by round ms: median [min, max] | µs CPU per chunk | µs CPU per request | RSS MiB "
        "| load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios(args):
        rows = [w.summary() for w in windows if w.scenario == scenario.name]
        direct = next((r for r in rows if r["target"] == "direct"), None)
        for r in rows:
            ttft = f"{r['ttft_p50_ms']:.2f} / {r['ttft_p99_ms']:.2f}" if "ttft_p50_ms" in r else "-"
            added = ""
            if direct is not None and r is not direct and "ttft_p50_ms" in r and "ttft_p50_ms" in direct:
                added = (
                    f"{r['ttft_p50_ms'] - direct['ttft_p50_ms']:+.2f} / {r['ttft_p99_ms'] - direct['ttft_p99_ms']:+.2f}"
                )
            chunk = f"{r['cpu_us_per_chunk']:.1f}" if "cpu_us_per_chunk" in r else ""
            request = f"{r['cpu_us_per_request']:.0f}" if "cpu_us_per_request" in r else ""
            rss = f"{r['rss_kib'] / 1024:.0f}" if r["rss_kib"] else ""
            load = f"{statistics.median(r['load']):.1f}" if r["load"] else ""
            lines.append(
                f"| {scenario.label} | {r['target']} | {r['requests']} | {r['errors']} | {ttft} | {added} "
                f"| {_round_spread(r, direct)} | {chunk} | {request} | {rss} | {load} |"
            )
    return lines


def render(windows: list[Window], args: argparse.Namespace) -> str:
    lines: list[str] = ["**Summary**, every scenario:", "", *_summary_table(windows, args), ""]
    for scenario in scenarios(args):
        rows = [w.summary() for w in windows if w.scenario == scenario.name]
        if scenario.paced:
            lines += [f"**{scenario.name}**, {args.chunks} chunks one every {PACE_MS:g} ms:", ""]
            lines += _paced_table(rows)
        else:
            lines += [f"**{scenario.name}**, {args.chunks} chunks per request as fast as the engine writes:", ""]
            lines += _saturated_table(rows)
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 8], help="concurrent closed-loop streams")
    parser.add_argument("--burst", type=int, default=0, help="also a burst: this many paced requests sent together")
    parser.add_argument("--chunks", type=int, default=64, help="chunks per request")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per target and scenario")
    parser.add_argument("--rounds", type=int, default=2, help="each target's time is split into this many rounds")
    parser.add_argument("--loops", nargs="+", default=["uvloop", "asyncio"], choices=("uvloop", "asyncio"))
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=PYTHON",
                        help="also measure `pdctl proxy` of another installation (its python)")  # fmt: skip
    parser.add_argument("--prototype", default=None, help="a script taking pdctl proxy's flags (a candidate stack)")
    parser.add_argument("--go-relay", default=None, help="binary of benchmarks/prototypes/go-relay (go build)")
    parser.add_argument("--vllm-router", default=None, metavar="VENV", help="vllm-router's venv (router_venv.sh)")
    parser.add_argument("--toy-proxy", default=None, help="path to a local moriio_toy_proxy_server.py")
    parser.add_argument("--toy-python", default=sys.executable, help="python with quart and hypercorn")
    parser.add_argument("--only", nargs="+", default=[], help="run only the scenarios whose name contains one of these")
    parser.add_argument("--json", default=None, help="also write the summaries to this file")
    parser.add_argument("--profile-with", default=None, metavar="PY_SPY", help="py-spy: a flame graph per window")
    parser.add_argument("--profile-dir", default=".", help="where --profile-with writes its files")
    parser.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw"), help="py-spy's")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    if os.cpu_count() is None or (os.cpu_count() or 0) < 2:
        sys.stderr.write("needs two CPUs: one for the proxy, one for the load generator and the engines\n")
        return 2
    os.sched_setaffinity(0, {LOAD_CPU})
    if argv and argv[0] == "engine":
        prefill_port, decode_port, *registration = argv[1:]
        eventloop.run(_run_engines(int(prefill_port), int(decode_port), registration))
        return 0
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    windows = eventloop.run(main_async(args))
    sys.stdout.write(machine_line(load_before) + "\n\n" + render(windows, args))
    if args.json:
        Path(args.json).write_text(json.dumps([w.summary() for w in windows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
