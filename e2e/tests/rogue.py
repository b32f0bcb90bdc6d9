"""A rogue next to the serving pod's proxy: a process that is not one of the pod's engines, in the proxy's
network namespace (the pod's own, or with hostNetwork the node's), sends registration frames: a decode
engine of its own, answering HTTP at the address it announces, and the real prefill's address with
another side-channel host. ``check_rogue_gets_nothing`` asserts that the proxy refuses and counts both
and serves every client request on the real engines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import REPO_ROOT
from e2e.stack import Stack
from e2e.tests.kube import Obj, container_pids, proxy_status, stream_completion, wait_for

ROGUE = REPO_ROOT / "e2e" / "rogue_engine.py"
ROGUE_PORT = 45555
REQUESTS = 12


def _frames(pod_ip: str) -> dict[str, float]:
    """pd_proxy_registration_frames_total by result, read with Prometheus' own parser."""
    text = httpx.get(f"http://{pod_ip}:8001/metrics", timeout=10, trust_env=False).text
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "pd_proxy_registration_frames"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _rogue(pid: int, hits: Path, frames: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    """The rogue in the network namespace of the proxy's process (the pod's), as its own process group."""
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, str(ROGUE), "--port", str(ROGUE_PORT)]
    argv += ["--hits", str(hits), *(arg for frame in frames for arg in ("--frame", json.dumps(frame)))]
    return subprocess.Popen(argv, start_new_session=True)


def check_rogue_gets_nothing(stack: Stack, serving: Obj, tmp_path: Path, api_port: int = 8000) -> None:
    """Run the rogue in the network namespace of ``serving``'s proxy, then serve REQUESTS completions."""
    pod_ip = serving["status"]["podIP"]
    before = {i["role"]: i for i in proxy_status(stack.cp, serving)["instances"]}
    prefill = before["P"]
    assert prefill["zmq_address"].startswith(f"host:{pod_ip},")
    frames = [
        {
            "type": "D",
            "http_address": f"{pod_ip}:{ROGUE_PORT}",
            "zmq_address": f"host:{pod_ip},handshake:7401,notify:7601",
            "dp_size": 1,
            "tp_size": 1,
            "transfer_mode": "WRITE",
        },
        {
            "type": "P",
            "http_address": prefill["http_address"],
            "zmq_address": prefill["zmq_address"].replace(f"host:{pod_ip},", "host:127.0.0.1,"),
            "dp_size": prefill["dp_size"],
            "tp_size": prefill["tp_size"],
            "transfer_mode": "WRITE",
        },
    ]
    hits = tmp_path / "hits"
    rogue = _rogue(container_pids(stack.cp, serving, ["proxy"])["proxy"], hits, frames)
    try:
        # the rogue answers where it says it does, and the proxy sees and refuses its frames
        rogue_url = f"http://{pod_ip}:{ROGUE_PORT}/health"
        wait_for(lambda: _reachable(rogue_url), 30, "the rogue serving HTTP in the pod")
        wait_for(
            lambda: _frames(pod_ip).get("refused_unknown", 0) >= 3 and _frames(pod_ip).get("refused_mismatch", 0) >= 3,
            30,
            "the rogue's frames refused",
        )
        texts = [stream_completion(pod_ip, api_port) for _ in range(REQUESTS)]
        assert all(texts)
    finally:
        os.killpg(rogue.pid, signal.SIGTERM)  # the process group this test started
        rogue.wait(10)
    assert not hits.exists(), hits.read_text()
    after = {i["http_address"]: i for i in proxy_status(stack.cp, serving)["instances"]}
    assert set(after) == {prefill["http_address"], before["D"]["http_address"]}
    assert after[prefill["http_address"]]["zmq_address"] == prefill["zmq_address"]
    decode = after[before["D"]["http_address"]]
    assert decode["routed"] - before["D"]["routed"] >= REQUESTS


def _reachable(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
