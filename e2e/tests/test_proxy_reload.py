"""A proxy-only change reaches the running proxy through its ConfigMap; no engine restarts.

The operator renders routing and timeouts into the `<name>-proxy` ConfigMap, the kubelet refreshes
the mounted volume (an atomic ..data swap, within its `syncFrequency` of 5 s), and the proxy re-reads the file. A file
that would break what the engines rely on (a KV wait past their defer timeout) is refused in place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    container_pids,
    container_status,
    proxy_status,
    serving_pod,
    simulated_deployment,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

NAME = "reload"
ENGINES = ("prefill", "decode")


@pytest.fixture(scope="module")
def deployed(operator: Stack) -> Iterator[str]:
    with simulated_deployment(operator.cp, "pd-reload", NAME) as namespace:
        yield namespace


def _serving(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    return serving_pod(cp, namespace, NAME)


def _pids(stack: Stack, serving: dict[str, Any]) -> dict[str, int]:
    return container_pids(stack.cp, serving, (*ENGINES, "proxy"))


def _proxy_config(cp: ControlPlane, serving: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = proxy_status(cp, serving)["config"]
    return doc


def test_a_policy_change_reaches_the_proxy_without_restarting_the_engines(
    stack: Stack, cp: ControlPlane, deployed: str
) -> None:
    before = _serving(cp, deployed)
    pids = _pids(stack, before)
    assert _proxy_config(cp, before)["settings"]["policy"] == "round_robin"

    admission = {"maxInFlight": 64, "maxQueued": 128, "queueTimeoutSeconds": 20}
    affinity = {"prefixTokens": 128, "maxImbalance": 2}
    proxy = {
        "policy": "prefix_affinity",
        "prefixAffinity": affinity,
        "timeouts": {"idleSeconds": 30},
        "admission": admission,
    }
    patch = json.dumps({"spec": {"proxy": proxy}})
    cp.kubectl("patch", "pdd", NAME, "-n", deployed, "--type=merge", "-p", patch)

    def reloaded() -> dict[str, Any] | None:
        doc = _proxy_config(cp, before)
        return doc if doc["settings"]["policy"] == "prefix_affinity" else None

    doc = wait_for(reloaded, 60, "the proxy running the new policy")
    assert doc["settings"]["idle-timeout"] == 30 and doc["refused"] is None
    settings = doc["settings"]
    assert (settings["max-in-flight"], settings["max-queued"], settings["queue-timeout"]) == (64, 128, 20)
    assert (settings["affinity-prefix-tokens"], settings["affinity-max-imbalance"]) == (128, 2)
    after = wait_pdd_ready(cp, deployed, NAME, timeout_s=60)
    current = _serving(cp, deployed)
    assert current["metadata"]["uid"] == before["metadata"]["uid"], "the pod was not rolled"
    assert _pids(stack, current) == pids, "no container was restarted"
    assert all(container_status(current, name)["restartCount"] == 0 for name in (*ENGINES, "proxy"))
    assert after["status"]["observedGeneration"] == after["metadata"]["generation"]
    assert stream_completion(current["status"]["podIP"])


def test_a_settings_file_past_the_engines_limit_is_refused_in_place(
    stack: Stack, cp: ControlPlane, deployed: str
) -> None:
    serving = _serving(cp, deployed)
    pids = _pids(stack, serving)
    running = _proxy_config(cp, serving)
    settings = {**running["settings"], "kv-wait-timeout": 500}  # a hand edit past defer + transfer timeout
    patch = json.dumps({"data": {"proxy.json": json.dumps(settings)}})
    cp.kubectl("patch", "configmap", f"{NAME}-proxy", "-n", deployed, "--type=merge", "-p", patch)

    def refused() -> dict[str, Any] | None:
        doc = _proxy_config(cp, serving)
        return doc if doc["refused"] is not None else None

    doc = wait_for(refused, 60, "the proxy refusing the file")
    assert doc["refused"]["reason"].startswith("kv-wait-timeout 500 is above the engines' limit")
    assert doc["settings"] == running["settings"] and doc["digest"] == running["digest"]
    metrics = httpx.get(f"http://{serving['status']['podIP']}:8001/metrics", timeout=5, trust_env=False).text
    assert "pd_proxy_config_refused 1.0" in metrics
    assert _pids(stack, _serving(cp, deployed)) == pids
