"""xPyD on one node end to end: `kubectl apply` of examples/simulated-2p1d.yaml (two prefill engines and
one decode engine in one pod, load-aware routing), served through the proxy; then one prefill engine's
process is killed (its container's pid 1, as a crash) and the proxy fails over while the kubelet restarts it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    Obj,
    apply,
    condition,
    create_namespace,
    kill_container,
    pdd,
    pod,
    proxy_status,
    wait_for,
    wait_pdd_ready,
)

EXAMPLE = REPO_ROOT / "examples" / "simulated-2p1d.yaml"
NAME = "sim-2p1d"
ENGINES = ["prefill-0", "prefill-1", "decode"]


@pytest.fixture(scope="module")
def xpyd(operator: Stack) -> Iterator[str]:
    cp = operator.cp
    namespace = "pd-xpyd"
    create_namespace(cp, namespace)
    obj: Obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["goodputProbe"] = {"enabled": False}  # the probe is covered elsewhere; keep this file short
    apply(cp, json.dumps(obj), namespace)
    wait_pdd_ready(cp, namespace, NAME, timeout_s=180)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def serving(cp: ControlPlane, namespace: str) -> Obj:
    obj = pdd(cp, namespace, NAME)
    assert obj is not None
    found = pod(cp, namespace, obj["status"]["podName"])
    assert found is not None
    return found


def streamed(pod_ip: str, model: str) -> bool:
    """One streamed completion through the proxy: True when it ended with [DONE] and no error event."""
    body = {"model": model, "prompt": "Disaggregate prefill and decode.", "max_tokens": 8, "stream": True}
    try:
        with httpx.stream(
            "POST", f"http://{pod_ip}:8000/v1/completions", json=body, timeout=60, trust_env=False
        ) as resp:
            text = resp.read().decode()
    except httpx.HTTPError:
        return False
    return resp.status_code == 200 and '"error"' not in text and text.endswith("data: [DONE]\n\n")


def burst(pod_ip: str, count: int, workers: int = 8) -> list[bool]:
    model = httpx.get(f"http://{pod_ip}:8000/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: streamed(pod_ip, model), range(count)))


def prefill_instances(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in doc["instances"] if i["role"] == "P"]


def test_xpyd_pod_has_a_container_per_engine_and_counts_prefill_readiness(cp: ControlPlane, xpyd: str) -> None:
    obj = pdd(cp, xpyd, NAME)
    assert obj is not None
    assert [r["name"] for r in obj["status"]["roles"]] == [*ENGINES, "proxy"]
    assert (obj["status"]["ready"], obj["status"]["containersReady"]) == ("1/1", "4/4")
    prefill = condition(obj, "PrefillReady") or {}
    assert prefill.get("status") == "True" and prefill.get("message", "").startswith("2/2 ready")
    containers = serving(cp, xpyd)["spec"]["containers"]
    ports = [p["containerPort"] for c in containers for p in c["ports"]]
    assert [c["name"] for c in containers] == [*ENGINES, "proxy"] and len(ports) == len(set(ports))


def test_least_load_serves_through_both_prefill_instances(cp: ControlPlane, xpyd: str) -> None:
    live = serving(cp, xpyd)
    pod_ip = live["status"]["podIP"]
    assert all(burst(pod_ip, 40))
    doc = proxy_status(cp, live)
    assert doc["policy"] == "least_load"
    prefills = prefill_instances(doc)
    assert len(prefills) == 2 and all(p["routed"] > 0 for p in prefills), prefills
    assert all(p["load_age_s"] is not None and "0" in p["load"] for p in doc["instances"]), doc["instances"]
    verified = wait_for(
        lambda: (condition(pdd(cp, xpyd, NAME), "KVTransferVerified") or {}).get("status") == "True",
        60,
        "KVTransferVerified",
    )
    assert verified


def test_a_killed_prefill_instance_fails_over_then_returns(cp: ControlPlane, xpyd: str) -> None:
    live = serving(cp, xpyd)
    meta, pod_ip = live["metadata"], live["status"]["podIP"]
    with ThreadPoolExecutor(1) as runner:
        probe = runner.submit(burst, pod_ip, 60)
        time.sleep(0.5)  # the probe is running
        kill_container(cp, live, "prefill-0")  # the engine crashes
        results = probe.result()
    # a request that met the dead engine before its first byte was served again on prefill-1; in write
    # mode a request already streaming needs prefill no more, so none is lost
    assert all(results), f"{results.count(False)} of {len(results)} failed"

    def restarts() -> int | None:
        roles = ((pdd(cp, xpyd, NAME) or {}).get("status") or {}).get("roles", [])
        count = next((r["restartCount"] for r in roles if r["name"] == "prefill-0"), 0)
        return count or None

    assert wait_for(restarts, 60, "prefill-0 restarted by the kubelet") >= 1
    wait_pdd_ready(cp, xpyd, NAME, timeout_s=180)
    assert serving(cp, xpyd)["metadata"]["uid"] == meta["uid"], "restarted in place"
    # back in rotation once it heartbeats and passes /health again
    wait_for(lambda: all(p["healthy"] for p in prefill_instances(proxy_status(cp, live))) or None, 60, "prefill-0 back")
    assert all(burst(pod_ip, 16))
