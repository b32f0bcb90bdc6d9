"""Migration end to end (docs/proxy.md, "Migration"): a simulated 1P2D PDDeployment (one prefill engine, two
decode engines in one pod); the decode engine serving a greedy stream is killed mid-answer (its container's
pid 1, as a crash), and the client's token ids equal those of the same request undisturbed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    Obj,
    apply,
    create_namespace,
    kill_container,
    pdd,
    pod,
    proxy_status,
    wait_for,
    wait_pdd_ready,
)

NAME = "sim-1p2d"
DECODES = {"decode-0": 40005, "decode-1": 40006}
BODY = {"prompt": "Continue where the dead engine stopped.", "max_tokens": 120, "stream": True, "ignore_eos": True,
        "temperature": 0, "return_token_ids": True, "stream_options": {"include_usage": True}}  # fmt: skip


@pytest.fixture(scope="module")
def one_p_two_d(operator: Stack) -> Iterator[str]:
    """examples/simulated-2p1d.yaml turned around: one prefill engine, two decode engines; a token every
    ~19 ms (timeScale 2), so a 120-token answer streams for seconds."""
    cp = operator.cp
    namespace = "pd-migration"
    create_namespace(cp, namespace)
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / "simulated-2p1d.yaml").read_text())
    spec = obj["spec"]
    obj["metadata"]["name"] = NAME
    spec["simulation"]["timeScale"] = 2
    spec["goodputProbe"] = {"enabled": False}
    spec["prefill"] = {
        **spec["prefill"],
        "instances": [],
        "gpus": "0-1",
        "ports": spec["prefill"]["instances"][0]["ports"],
    }
    decode = spec["decode"]
    spec["decode"] = {
        **{k: v for k, v in decode.items() if k != "gpus"},
        "tensorParallelSize": 2,
        "instances": [
            {"gpus": "4-5", "ports": {"http": DECODES["decode-0"], "handshake": 7301, "notify": 7501}},
            {"gpus": "6-7", "ports": {"http": DECODES["decode-1"], "handshake": 7311, "notify": 7511}},
        ],
    }
    apply(cp, json.dumps(obj), namespace)
    wait_pdd_ready(cp, namespace, NAME, timeout_s=180)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def stream_ids(pod_ip: str, model: str, on_tokens: Any = None) -> tuple[list[int], list[Obj]]:
    """One greedy streamed completion through the proxy: its token ids and its events."""
    ids: list[int] = []
    events: list[Obj] = []
    url = f"http://{pod_ip}:8000/v1/completions"
    with httpx.stream("POST", url, json={**BODY, "model": model}, timeout=120, trust_env=False) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            events.append(json.loads(line.removeprefix("data: ")))
            ids += [t for c in events[-1].get("choices") or [] for t in c.get("token_ids") or []]
            if on_tokens is not None:
                on_tokens(len(ids))
    return ids, events


def test_a_decode_engine_killed_mid_stream_is_migrated_with_the_same_tokens(cp: ControlPlane, one_p_two_d: str) -> None:
    obj = pdd(cp, one_p_two_d, NAME)
    assert obj is not None
    live = pod(cp, one_p_two_d, obj["status"]["podName"])
    assert live is not None
    pod_ip = live["status"]["podIP"]
    wait_for(lambda: proxy_status(cp, live)["counts"]["decode"] == 2 or None, 60, "both decode engines routable")
    model = httpx.get(f"http://{pod_ip}:8000/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
    expected, _ = stream_ids(pod_ip, model)
    killed: list[str] = []

    def kill_the_streaming_decode(tokens: int) -> None:
        if tokens < 20 or killed:
            return
        busy = {i["http_address"].rsplit(":", 1)[1] for i in proxy_status(cp, live)["instances"] if i["in_flight"]}
        (name,) = [n for n, port in DECODES.items() if str(port) in busy]
        kill_container(cp, live, name)
        killed.append(name)

    got, events = stream_ids(pod_ip, model, kill_the_streaming_decode)
    assert killed and len(expected) == 120
    assert got == expected  # no token twice, none missing: the undisturbed run's greedy tokens
    assert len({e["id"] for e in events}) == 1 and not any("error" in e for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 120
