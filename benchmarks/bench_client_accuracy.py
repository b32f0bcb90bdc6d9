"""How accurately does `pdctl bench` measure TTFT and ITL, and which HTTP client reads streams cheaper?

The calibration server (pd_runtime.bench.calibration_server) runs in its own process and records when
it received each request and when it wrote each token; the bench's per-request TTFT and ITL are
compared with the server's. Two parts, both against the same server process:

1. client library, side by side in one run: the bench's aiohttp client and an equivalent httpx reader
   (same SSE decoder, same chunk handling) stream the same open-loop load, alternating twice; we report
   client CPU per received chunk and the TTFT/ITL error of each;
2. the seed's settings through the real CLI: `pdctl bench` with 100 requests at 8 req/s, 2000-token
   prompts and 1000-token outputs, at the seed's cadence (38 ms per token) in real time (about a
   minute), no time scaling;
3. the same settings against the simulated engine (`pdctl sim-engine`, colocated, the seed's profile,
   real time), comparing the bench's mean TTFT and mean per-request ITL with the engine's own vLLM
   histograms (vllm:time_to_first_token_seconds, vllm:request_time_per_output_token_seconds): only means can
   be compared there, per request is not exposed. Skipped with --no-sim.

Usage: .venv/bin/python benchmarks/bench_client_accuracy.py [--quick] [--no-sim] [--update-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from pd_runtime import eventloop
from pd_runtime.bench.client import REQUEST_ID_HEADER, BenchClient, ClientConfig
from pd_runtime.bench.plan import PlannedRequest
from pd_runtime.bench.slo import RequestTiming, request_itl_s
from pd_runtime.bench.stats import percentile
from pd_runtime.localports import PortReservation
from pd_runtime.openai_api import DONE, Endpoint, SseDecoder, interpret
from pd_runtime.workload.arrivals import Arrival, arrival_offsets, stage_rng
from pd_runtime.workload.payload import encode_body, request_body

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench-client-timing:begin -->", "<!-- bench-client-timing:end -->"
PYTHON = sys.executable


@dataclass(frozen=True)
class Load:
    requests: int
    rate: float
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    itl_ms: float


@dataclass(frozen=True)
class Errors:
    """Client minus server, in ms, over successful requests."""

    ttft: list[float]
    itl: list[float]

    def row(self) -> str:
        return f"{_stats(self.ttft)} | {_stats(self.itl, digits=4)}"


class CalibrationProcess:
    """The calibration server in a child process, so it never shares an event loop with the client."""

    def __init__(self, load: Load) -> None:
        self._process = subprocess.Popen(
            [PYTHON, "-m", "pd_runtime.bench.calibration_server", "--port", "0",
             "--ttft-ms", str(load.ttft_ms), "--itl-ms", str(load.itl_ms)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().split()[-1]

    def timings(self) -> dict[str, dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/timings", timeout=30) as response:
            return {row["request_id"]: row for row in json.load(response)}

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)


def errors_against_server(
    client: Sequence[tuple[str, float | None, float | None]], server: dict[str, dict[str, Any]]
) -> Errors:
    """``client`` holds (request id, TTFT s, ITL s) as the bench measured them."""
    ttft, itl = [], []
    for request_id, client_ttft, client_itl in client:
        truth = server[request_id]
        if client_ttft is not None and truth["ttft_s"] is not None:
            ttft.append((client_ttft - truth["ttft_s"]) * 1e3)
        if client_itl is not None and truth["itl_s"] is not None:
            itl.append((client_itl - truth["itl_s"]) * 1e3)
    return Errors(ttft, itl)


# Part 1: aiohttp (the bench's client) against an equivalent httpx reader.

Reader = Callable[[str, Sequence[PlannedRequest]], Coroutine[Any, Any, tuple[list[RequestTiming], int]]]


def plan(load: Load, tag: str) -> list[PlannedRequest]:
    offsets = arrival_offsets(load.requests, load.rate, Arrival.POISSON, stage_rng(0, load.rate, "arrivals"))
    rng = stage_rng(0, load.rate, "prompts")
    return [
        PlannedRequest(
            index=i, request_id=f"{tag}-{i}", warmup=False, offset_s=offset,
            body=encode_body(request_body(Endpoint.COMPLETIONS, "m", load.prompt_tokens, load.output_tokens, rng)),
        )
        for i, offset in enumerate(offsets)
    ]  # fmt: skip


async def aiohttp_reader(url: str, requests: Sequence[PlannedRequest]) -> tuple[list[RequestTiming], int]:
    config = ClientConfig(url=url + "/v1/completions", endpoint=Endpoint.COMPLETIONS, timeout_s=600)
    async with BenchClient(config) as client:
        timings = await client.run_stage(requests, lambda timing: None)
    return timings, sum(t.completion_tokens for t in timings)


async def httpx_reader(url: str, requests: Sequence[PlannedRequest]) -> tuple[list[RequestTiming], int]:
    """Same open loop, decoder and clock as BenchClient, with httpx's pooled AsyncClient (no caps)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:

        async def send(request: PlannedRequest, start: float) -> RequestTiming:
            decoder, first, last, tokens = SseDecoder(), None, None, 0
            sent = time.perf_counter()
            headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: request.request_id}
            async with client.stream("POST", url + "/v1/completions", content=request.body, headers=headers) as reply:
                async for chunk in reply.aiter_raw():
                    arrived = time.perf_counter()
                    for payload in decoder.feed(chunk):
                        if payload == DONE:
                            continue
                        info = interpret(json.loads(payload), Endpoint.COMPLETIONS)
                        if info.carries_token:
                            first = arrived if first is None else first
                            last = arrived
                        tokens = info.completion_tokens or tokens
            return RequestTiming(
                index=request.index, request_id=request.request_id, warmup=False, scheduled_s=request.offset_s,
                sent_s=sent - start, end_s=time.perf_counter() - start,
                first_token_s=None if first is None else first - start,
                last_token_s=None if last is None else last - start, completion_tokens=tokens,
            )  # fmt: skip

        start = time.perf_counter()
        tasks = []
        for request in requests:
            delay = start + request.offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(request, start)))
        timings = list(await asyncio.gather(*tasks))
    return timings, sum(t.completion_tokens for t in timings)


def compare_clients(load: Load, rounds: int) -> list[str]:
    server = CalibrationProcess(load)
    readers: dict[
        str, Callable[[str, Sequence[PlannedRequest]], Coroutine[Any, Any, tuple[list[RequestTiming], int]]]
    ] = {
        f"aiohttp {aiohttp.__version__}": aiohttp_reader,
        f"httpx {httpx.__version__}": httpx_reader,
    }
    cpu_us: dict[str, list[float]] = {name: [] for name in readers}
    errors: dict[str, Errors] = {name: Errors([], []) for name in readers}
    try:
        for round_no in range(rounds):
            for name, reader in readers.items():
                cpu_before = time.process_time()
                requests = plan(load, f"{name.split()[0]}{round_no}")
                timings, chunks = eventloop.run(reader(server.url, requests))
                cpu_us[name].append((time.process_time() - cpu_before) / max(chunks, 1) * 1e6)
                measured = [(t.request_id, None, request_itl_s(t)) for t in timings]
                found = errors_against_server(measured, server.timings())
                errors[name].itl.extend(found.itl)
    finally:
        server.stop()
    base = statistics.median(cpu_us[next(iter(readers))])
    lines = [
        "| client | client CPU per token (µs, median of rounds) | ratio to aiohttp | ITL error ms (mean / p99 / max) |",
        "|---|---|---|---|",
    ]
    for name in readers:
        median = statistics.median(cpu_us[name])
        lines.append(f"| {name} | {median:.1f} | {median / base:.2f} | {_stats(errors[name].itl, digits=4)} |")
    return lines


# Part 2: the seed's settings through the real CLI.


def bench_command(url: str, model: str, load: Load) -> list[str]:
    return [
        "pdctl", "bench", "--url", url, "--model", model, "--rate", f"{load.rate:g}",
        "--requests", str(load.requests), "--prompt-tokens", str(load.prompt_tokens),
        "--output-tokens", str(load.output_tokens), "--slo-ttft-ms", "1000", "--slo-itl-ms", "50",
    ]  # fmt: skip


def run_bench(command: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "result.json"
        pdctl = str(Path(PYTHON).parent / "pdctl")
        subprocess.run([pdctl, *command[1:], "--output", str(output), "--quiet"], check=True, cwd=ROOT)
        result: dict[str, Any] = json.loads(output.read_text())
        return result


def seed_settings(load: Load) -> tuple[list[str], str]:
    server = CalibrationProcess(load)
    command = bench_command(server.url, "seed", load)
    try:
        result = run_bench(command)
        truth = server.timings()
    finally:
        server.stop()
    records = result["records"]
    measured = [(r["id"], _ms_to_s(r["ttft_ms"]), _ms_to_s(r["itl_ms"])) for r in records]
    found = errors_against_server(measured, truth)
    stage = result["stages"][0]
    lines = [
        "| requests | good | TTFT error ms (mean / p99 / max) | ITL error ms (mean / p99 / max) | send lag p99 ms |",
        "|---|---|---|---|---|",
        f"| {result['requests']} | {result['good']} | {found.row()} | {stage['send_lag_ms']['p99']} |",
    ]
    shown = " ".join(command).replace(server.url, "URL")
    return lines, shown


# Part 3: the simulated engine's own histograms.

SIM_MODEL = "Qwen/Qwen3-235B-A22B-FP8"
SIM_ARGS = ["-tp", "8", "--profile", "qwen3-235b-mi300x"]


def simulated_engine(load: Load) -> tuple[list[str], str]:
    ports = PortReservation()
    port = ports.port()
    url = f"http://127.0.0.1:{port}"
    engine = subprocess.Popen(
        [str(Path(PYTHON).parent / "pdctl"), "sim-engine", SIM_MODEL, "--host", "127.0.0.1", "--port", str(port),
         *SIM_ARGS], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    command = bench_command(url, SIM_MODEL, load)
    try:
        _wait_healthy(url)
        ports.release()
        before = _histogram_sums(url)
        result = run_bench(command)
        after = _histogram_sums(url)
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    server_ttft_ms = _mean_between(before, after, "vllm:time_to_first_token_seconds") * 1e3
    server_itl_ms = _mean_between(before, after, "vllm:request_time_per_output_token_seconds") * 1e3
    records = [r for r in result["records"] if r["error"] is None]
    client_ttft_ms = statistics.fmean(r["ttft_ms"] for r in records)
    client_itl_ms = statistics.fmean(r["itl_ms"] for r in records if r["itl_ms"] is not None)
    lines = [
        "| requests | good | mean TTFT ms: bench / engine / error | mean ITL ms: bench / engine / error |",
        "|---|---|---|---|",
        f"| {result['requests']} | {result['good']} | {client_ttft_ms:.3f} / {server_ttft_ms:.3f} / "
        f"{client_ttft_ms - server_ttft_ms:.3f} | {client_itl_ms:.4f} / {server_itl_ms:.4f} / "
        f"{client_itl_ms - server_itl_ms:.4f} |",
    ]
    shown = " ".join(command).replace(url, "URL")
    return lines, f"pdctl sim-engine {SIM_MODEL} {' '.join(SIM_ARGS)}` and `{shown}"


def _wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout_s:g} s")


def _histogram_sums(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of every histogram, from the engine's Prometheus text."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        samples = {sample.name: sample.value for sample in family.samples}
        if f"{family.name}_count" in samples:
            found[family.name] = (samples[f"{family.name}_sum"], samples[f"{family.name}_count"])
    return found


def _mean_between(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], name: str) -> float:
    total = after[name][0] - before.get(name, (0.0, 0.0))[0]
    count = after[name][1] - before.get(name, (0.0, 0.0))[1]
    return total / count


def _ms_to_s(value: float | None) -> float | None:
    return None if value is None else value / 1e3


def _stats(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return "- / - / -"
    worst = max(values, key=abs)
    return f"{statistics.fmean(values):.{digits}f} / {percentile(values, 99):.{digits}f} / {worst:.{digits}f}"


def machine() -> str:
    load1, _, _ = os.getloadavg()
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load1:.2f} at start, "
        f"Python {platform.python_version()}, client and server on {eventloop.loop_name()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller loads (a smoke run, not for the docs)")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated-engine part")
    parser.add_argument("--update-docs", action="store_true", help=f"rewrite this benchmark's section of {DOCS}")
    args = parser.parse_args()
    library_load = Load(requests=60 if args.quick else 200, rate=20, prompt_tokens=2000, output_tokens=200,
                        ttft_ms=50, itl_ms=10)  # fmt: skip
    seed_load = Load(requests=20 if args.quick else 100, rate=8, prompt_tokens=2000,
                     output_tokens=100 if args.quick else 1000, ttft_ms=150, itl_ms=38)  # fmt: skip
    started = machine()
    library_lines = compare_clients(library_load, rounds=1 if args.quick else 2)
    seed_lines, command = seed_settings(seed_load)
    sim = None if args.no_sim else simulated_engine(seed_load)
    report = render(library_load, library_lines, seed_load, seed_lines, command, started, sim)
    sys.stdout.write(report + "\n")
    if args.update_docs:
        update_docs(report)
    return 0


def render(
    library: Load,
    library_lines: list[str],
    seed: Load,
    seed_lines: list[str],
    command: str,
    host: str,
    sim: tuple[list[str], str] | None,
) -> str:
    sim_part = [] if sim is None else [
        f"**Simulated engine**, same settings, real time: `{sim[1]}`; the bench's means against the "
        "engine's own histograms (`vllm:time_to_first_token_seconds`, `vllm:request_time_per_output_token_seconds`):",
        "",
        *sim[0],
        "",
    ]  # fmt: skip
    return "\n".join([
        BEGIN,
        "Generated by `.venv/bin/python benchmarks/bench_client_accuracy.py --update-docs` (about four minutes). "
        "Errors are client minus server, in ms.",
        f"Measured on: {host}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"**Seed settings**, real time (no time scaling): `{command}` against the calibration server emitting "
        f"the first token {seed.ttft_ms:g} ms after a request and one token every {seed.itl_ms:g} ms:",
        "",
        *seed_lines,
        "",
        *sim_part,
        f"**HTTP client**, side by side in one run (alternating, {library.requests} requests at "
        f"{library.rate:g} req/s, {library.prompt_tokens}-token prompts, {library.output_tokens} tokens every "
        f"{library.itl_ms:g} ms): the bench's aiohttp client and an equivalent httpx reader (same SSE decoder):",
        "",
        *library_lines,
        END,
    ])  # fmt: skip


def update_docs(report: str) -> None:
    """Replace only the generated part of this benchmark's section (between its markers)."""
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS} has no {BEGIN} ... {END} markers under 'Bench client timing error'")
    before, rest = text.split(BEGIN, 1)
    DOCS.write_text(before + report + rest.split(END, 1)[1])


if __name__ == "__main__":
    sys.exit(main())
