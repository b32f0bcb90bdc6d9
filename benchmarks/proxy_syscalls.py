"""System calls per request of `pdctl proxy` and of vllm-router, counted by ``strace -c`` (not a test).

What callgrind does not count (``proxy_instructions.py``): the kernel's share of a request. Each proxy
serves a warm-up from the fake engines of ``proxy_overhead.py`` (write mode, uvloop for ours), then
``strace -c -f`` attaches to it, all its threads, for ``--requests`` streamed one-chunk requests sent
``--concurrency`` at a time, and each system call's count is divided by the requests. Tracing slows every
call, so the counts are the calls made under it; both proxies run under the same tracing.

    .venv/bin/python benchmarks/proxy_syscalls.py [--vllm-router VENV] [--compare NAME=PYTHON ...]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import proxy_overhead as harness
from proxy_instructions import _batch

from pd_runtime import eventloop
from pd_runtime.localports import PortReservation

ONE_CHUNK = {"model": "bench-model", "prompt": "hi", "max_tokens": 1, "stream": True}


def _target(name: str, command: str, registration: str, ports: PortReservation) -> harness.Target:
    if name.startswith("vllm-router"):
        return harness._vllm_router(command, registration, ports)
    return harness._pdctl_proxy(name, [command, "-m", "pd_runtime.cli", "proxy"], "uvloop", registration, ports)


def _calls(summary: str) -> dict[str, int]:
    """Calls per system call from ``strace -c``'s table (``% time seconds usecs/call calls [errors] name``)."""
    calls = {}
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].replace(".", "").isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    return calls


async def _count(name: str, command: str, args: argparse.Namespace) -> dict[str, float]:
    ports = PortReservation()
    prefill_port, decode_port, registration = ports.port(), ports.port(), f"tcp://127.0.0.1:{ports.port()}"
    engines = harness._spawn(
        [sys.executable, harness.__file__, "engine", str(prefill_port), str(decode_port), registration],
        harness.LOAD_CPU,
    )
    target = _target(name, command, registration, ports)
    assert target.proc is not None
    try:
        await harness._wait_ready(target.url, timeout=120)
        ports.release()
        await _batch(target.url, args.warmup, args.concurrency, ONE_CHUNK)
        with tempfile.NamedTemporaryFile(suffix=".strace") as out:
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", out.name, "-p", str(target.proc.pid)])
            time.sleep(1.0)  # attached to every thread
            await _batch(target.url, args.requests, args.concurrency, ONE_CHUNK)
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=60)
            calls = _calls(Path(out.name).read_text())
        return {call: count / args.requests for call, count in calls.items()}
    finally:
        for proc in (target.proc, engines):
            proc.terminate()
            proc.wait(timeout=60)


def _table(counted: dict[str, dict[str, float]]) -> str:
    names = sorted({call for calls in counted.values() for call in calls})
    rows = [f"| system call | {' | '.join(counted)} |", f"|---|{'---|' * len(counted)}"]
    for call in [*names, "total"]:
        cells = [calls.get(call, 0.0) if call != "total" else sum(calls.values()) for calls in counted.values()]
        rows.append(f"| {call} | {' | '.join(f'{cell:.2f}' for cell in cells)} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-router", default=None, metavar="VENV", help="vllm-router's venv (router_venv.sh)")
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=PYTHON",
                        help="another installation's python running pdctl proxy")  # fmt: skip
    parser.add_argument("--requests", type=int, default=1000, help="requests counted per proxy")
    parser.add_argument("--warmup", type=int, default=100, help="requests served before counting")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    args = parser.parse_args(argv)
    targets = [("pdctl proxy", sys.executable), *(tuple(c.split("=", 1)) for c in args.compare)]
    if args.vllm_router:
        targets.append((f"vllm-router {harness.router_version(args.vllm_router)}", args.vllm_router))
    counted = {name: eventloop.run(_count(name, command, args), "uvloop") for name, command in targets}
    print(
        f"{args.requests} one-chunk requests, {args.concurrency} at a time; system calls per request (strace -c -f).\n"
    )
    print(_table(counted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
