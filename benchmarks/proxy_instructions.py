"""Instructions `pdctl proxy` executes per request and per relayed chunk, counted by callgrind (not a test).

CPU time on a shared machine moves with its load by 10 % and more between runs; the instructions a process
executes for the same work do not. Each proxy (this installation's, and each ``--compare NAME=PYTHON``) runs
under ``valgrind --tool=callgrind`` with its instrumentation off, against the fake engines of
``proxy_overhead.py`` (write mode, uvloop); once it has served a warm-up, instrumentation goes on and two
batches are counted, each in a dump of its own: ``--requests`` streamed requests of one chunk (the request
path: the client's request, both legs, prefill's answer, decode's head and one chunk), then as many of
``--chunks`` chunks paced ``--pace-ms`` apart (one engine write, one proxy read per chunk). Per request is
the first batch's count over its requests; per chunk the second's extra over its extra chunks. The dumps
stay in ``--out`` for ``callgrind_annotate`` (with a mypyc build, our functions show by name: CPyDef_...).

    .venv/bin/python benchmarks/proxy_instructions.py [--compare NAME=PYTHON ...] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import proxy_overhead as harness

from pd_runtime import eventloop
from pd_runtime.localports import PortReservation


@dataclass
class Counted:
    name: str
    per_request: float
    per_chunk: float
    modules: str  # where the proxy's modules came from: compiled (mypyc) or Python


async def _batch(url: str, requests: int, concurrency: int, body: dict[str, Any]) -> int:
    """Send ``requests`` streamed requests, ``concurrency`` at a time; the chunks received."""
    chunks = 0
    queue = iter(range(requests))

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal chunks
        for _ in queue:
            async with session.post(url, json=body) as resp:
                data = await resp.read()
                if resp.status != 200 or not data.endswith(b"data: [DONE]\n\n"):
                    raise RuntimeError(f"request failed: {resp.status} {data[-200:]!r}")
                chunks += data.count(b"\n\n") - 1

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return chunks


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _instructions(dump: Path) -> int:
    """The total of a callgrind dump's event Ir (its ``totals:`` or ``summary:`` line)."""
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def _newest_dump(out: Path, stem: str, before: set[Path]) -> Path:
    for _ in range(600):
        fresh = sorted(set(out.glob(f"{stem}.*")) - before, key=lambda p: p.stat().st_mtime)
        if fresh and fresh[-1].stat().st_size > 0:
            time.sleep(0.5)  # written whole
            return fresh[-1]
        time.sleep(0.1)
    raise RuntimeError(f"callgrind wrote no dump for {stem}")


async def _count(name: str, python: str, args: argparse.Namespace, out: Path) -> Counted:
    ports = PortReservation()
    prefill_port, decode_port, port, registration = ports.port(), ports.port(), ports.port(), ports.port()
    address = f"tcp://127.0.0.1:{registration}"
    engines = harness._spawn(
        [sys.executable, harness.__file__, "engine", str(prefill_port), str(decode_port), address], harness.LOAD_CPU
    )
    stem = name.replace(" ", "-")
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes",
            f"--callgrind-out-file={out}/{stem}.%p", python, "-m", "pd_runtime.cli", "proxy", "--port", str(port),
            "--admin-port", str(ports.port()),
            "--registration-address", address, "--transfer-mode", "write", "--loop", "uvloop"]  # fmt: skip
    proxy = harness._spawn(argv, harness.PROXY_CPU)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        await harness._wait_ready(url, timeout=600)
        ports.release()
        one = {"model": "bench-model", "prompt": "hi", "max_tokens": 1, "stream": True}
        paced = {**one, "max_tokens": args.chunks, "bench_interval_ms": args.pace_ms}
        await _batch(url, args.warmup, args.concurrency, one)
        _control(proxy.pid, "-i", "on")
        counts = []
        for body in (one, paced):
            before = set(out.glob(f"{stem}.*"))
            _control(proxy.pid, "-z")
            chunks = await _batch(url, args.requests, args.concurrency, body)
            _control(proxy.pid, "-d")
            counts.append((_instructions(_newest_dump(out, stem, before)), chunks))
        (single, _), (many, chunks) = counts
        modules = subprocess.run(
            [python, "-c", "import pd_runtime.proxy.flows as m; print(m.__file__)"], capture_output=True, text=True
        ).stdout.strip()
        compiled = "compiled (mypyc)" if modules.endswith(".so") else "Python"
        return Counted(name, single / args.requests, (many - single) / (chunks - args.requests), compiled)
    finally:
        for proc in (proxy, engines):
            proc.terminate()
            proc.wait(timeout=60)


async def main_async(args: argparse.Namespace) -> list[Counted]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets = [("pdctl proxy", sys.executable), *(c.split("=", 1) for c in args.compare)]
    return [await _count(name, python, args, out) for name, python in targets]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=PYTHON",
                        help="also count `pdctl proxy` of another installation (its python)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=200, help="requests per counted batch")
    parser.add_argument("--warmup", type=int, default=50, help="requests served before counting")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--chunks", type=int, default=8, help="chunks per request of the second batch")
    parser.add_argument("--pace-ms", type=float, default=20.0, help="the second batch's gap between chunks")
    parser.add_argument("--out", default="/tmp/proxy-instructions", help="where the callgrind dumps go")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {harness.LOAD_CPU})
    rows = eventloop.run(main_async(args))
    lines = [
        f"{args.requests} requests per batch, {args.concurrency} at a time; per chunk from requests of "
        f"{args.chunks} chunks paced {args.pace_ms:g} ms apart. Instructions counted by callgrind.",
        "",
        "| target | modules | instructions per request (one chunk) | instructions per further chunk |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r.name} | {r.modules} | {r.per_request:,.0f} | {r.per_chunk:,.0f} |" for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
