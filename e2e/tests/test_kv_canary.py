"""KVTransferVerified means correct KV: a decode engine fed corrupted KV turns it False with KVMismatch.

The simulated decode engine runs with the corrupt-kv fault (``PD_SIM_CORRUPT_KV=1`` in its environment):
transfers complete as usual, but its greedy tokens differ from the ones the prefill engine computes for
the same prompt. The proxy's canary compares the two; the operator reads the mismatch from the proxy's
admin /status. With ``onKvMismatch: stopServing`` the proxy also answers 503 and fails its readiness.
The normal examples staying True is test_pddeployment.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from e2e.stack import Stack
from e2e.tests.kube import (
    apply,
    condition,
    create_namespace,
    pdd,
    pdd_events,
    simulated_example,
    wait_for,
)

NAME = "kv-corrupt"


@pytest.fixture(scope="module")
def corrupted(operator: Stack) -> Iterator[str]:
    cp = operator.cp
    namespace = create_namespace(cp, "pd-kv-canary")
    obj = simulated_example(NAME)
    spec = obj["spec"]
    spec["goodputProbe"] = {"enabled": False}
    spec["decode"]["env"] = [{"name": "PD_SIM_CORRUPT_KV", "value": "1"}]
    spec["proxy"] |= {"canaryIntervalSeconds": 30, "onKvMismatch": "stopServing"}
    apply(cp, json.dumps(obj), namespace)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_corrupted_kv_turns_kv_transfer_verified_false_with_an_event(operator: Stack, corrupted: str) -> None:
    cp = operator.cp

    def mismatch() -> dict[str, str] | None:
        found = condition(pdd(cp, corrupted, NAME), "KVTransferVerified")
        return found if found and found["reason"] == "KVMismatch" else None

    kv = wait_for(mismatch, 240, "KVTransferVerified KVMismatch")
    assert kv["status"] == "False"
    assert "differ from prefill's own at token 0" in kv["message"] and "tx-" in kv["message"]
    events = wait_for(lambda: pdd_events(cp, corrupted, NAME, "KVMismatch") or None, 60, "a KVMismatch Event")
    assert events[0]["type"] == "Warning" and "at token 0" in events[0]["message"]
    obj = pdd(cp, corrupted, NAME)
    assert obj is not None
    assert obj["status"]["replicaStatuses"][0]["available"] is False


def test_stop_serving_answers_503_and_leaves_the_service(operator: Stack, corrupted: str) -> None:
    cp = operator.cp

    def proxy_not_ready() -> bool:
        obj = pdd(cp, corrupted, NAME)
        proxy, kv = condition(obj, "ProxyReady"), condition(obj, "KVTransferVerified")
        return bool(proxy and proxy["status"] == "False" and kv and kv["reason"] == "KVMismatch")

    wait_for(lambda: proxy_not_ready() or None, 240, "ProxyReady False after the KV mismatch")
    obj = pdd(cp, corrupted, NAME)
    assert obj is not None
    base = f"http://{obj['status']['podIP']}:8000"
    body = {"model": obj["spec"]["model"], "prompt": "Hello", "max_tokens": 4}
    resp = httpx.post(f"{base}/v1/completions", json=body, timeout=30, trust_env=False)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "kv_mismatch"
    ready = httpx.get(f"{base}/ready", timeout=10, trust_env=False)
    assert ready.status_code == 503 and "KV mismatch" in ready.json()["reason"]
