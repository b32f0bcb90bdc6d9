"""vLLM 0.33's ``write_failed`` through the operator (issue 29): a write-mode PDDeployment whose prefill
drops every notify from decode, so decode's block list never reaches it and prefill gives up after
``defer_timeout``.

Simulated engines declare ``spec.engineVersion`` and reproduce that release's connector; the fault is the
simulator's ``--sim-drop-notify 1`` in ``prefill.extraArgs`` (the extraArgs guard refuses only the flags the
operator renders or counts on, so a simulator flag passes, as it would to a real vLLM that then refuses it;
``env`` with ``PD_SIM_DROP_NOTIFY`` is the other way, test_kv_canary.py's for its fault). ``defer_timeout``
is ``kvTransfer.deferTimeoutSeconds`` (20 engine seconds, 2 s at ``timeScale`` 10) and the proxy's KV wait
``proxy.timeouts.kvWaitSeconds`` one second above it. So a ``kv_load_failed`` answer, rather than the KV
wait's ``kv_transfer_timeout``, is itself the proof that the client heard within a second past
``defer_timeout`` (tests/sim/test_sim_write_failed.py argues the same: the proxy's deadline bounds it, not
a test clock on a loaded machine).

Three deployments, one per case, applied together so they come up side by side (a patch between cases
would recreate the one pod each time): 0.33.0 under ``loadFailurePolicy: fail`` (502 ``kv_load_failed``,
streamed or not, counted in ``pd_proxy_kv_load_failures_total``), 0.33.0 under ``recompute`` (decode
computes the prompt itself: 200 and the whole answer), and 0.32.0 (no ``write_failed``: decode waits and
the KV wait ends it, 502 ``kv_transfer_timeout``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import Obj, applied_in, serving_pod, simulated_example, wait_pdd_ready

NAMESPACE = "pd-write-failed"
TIME_SCALE = 10
DEFER_TIMEOUT_S = 20.0  # engine seconds: 2 s of wall time at TIME_SCALE
KV_WAIT_S = DEFER_TIMEOUT_S / TIME_SCALE + 1
MAX_TOKENS = 6
MODEL = simulated_example("")["spec"]["model"]
# name -> (engineVersion, loadFailurePolicy)
CASES = {"fail-033": ("0.33.0", "fail"), "recompute-033": ("0.33.0", "recompute"), "fail-032": ("0.32.0", "fail")}


def deployment(name: str, version: str, policy: str) -> Obj:
    obj = simulated_example(name)
    spec = obj["spec"]
    spec["engineVersion"] = version
    spec["simulation"] = {"profile": "instant", "timeScale": TIME_SCALE}
    spec["goodputProbe"] = {"enabled": False}
    spec["kvTransfer"] |= {
        "loadFailurePolicy": policy,
        "deferTimeoutSeconds": DEFER_TIMEOUT_S,
        "transferTimeoutSeconds": DEFER_TIMEOUT_S / 2,
    }
    # no canary: its KV transfer would meet the dropped notifies too
    spec["proxy"] |= {"canaryIntervalSeconds": 0, "timeouts": {"kvWaitSeconds": KV_WAIT_S}}
    spec["prefill"] |= {"gpus": "0", "tensorParallelSize": 1, "extraArgs": ["--sim-drop-notify", "1"]}
    spec["decode"] |= {"gpus": "1", "tensorParallelSize": 1}
    return obj


@pytest.fixture(scope="module")
def deployed(operator: Stack) -> Iterator[str]:
    with applied_in(operator.cp, NAMESPACE, [deployment(name, *case) for name, case in CASES.items()]):
        for name in CASES:
            wait_pdd_ready(operator.cp, NAMESPACE, name, timeout_s=180)
        yield NAMESPACE


def pod_ip(cp: ControlPlane, name: str) -> str:
    ip: str = serving_pod(cp, NAMESPACE, name)["status"]["podIP"]
    return ip


def complete(ip: str, stream: bool) -> tuple[int, Obj]:
    """One completion through the proxy: its status and its JSON body (an error's, or the whole answer's);
    a served stream is returned as its events' token ids and finish reason."""
    body = {"model": MODEL, "prompt": "Write, then fail.", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "return_token_ids": True, "stream": stream}  # fmt: skip
    with httpx.stream("POST", f"http://{ip}:8000/v1/completions", json=body, timeout=60, trust_env=False) as resp:
        text = resp.read().decode()
    if resp.status_code != 200 or not stream:
        return resp.status_code, json.loads(text)
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert text.endswith("data: [DONE]\n\n") and not any("error" in e for e in events), text
    choices = [c for e in events for c in e["choices"]]
    ids = [t for c in choices for t in c.get("token_ids") or []]
    return 200, {"choices": [{"token_ids": ids, "finish_reason": choices[-1]["finish_reason"]}]}


def proxy_counters(ip: str) -> dict[str, float]:
    """The proxy's KV failure counters (its admin /metrics, read with Prometheus' own parser)."""
    text = httpx.get(f"http://{ip}:8001/metrics", timeout=10, trust_env=False).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name.endswith("_total")]
    wanted: dict[str, Any] = {"kv_load_failures": ("pd_proxy_kv_load_failures_total", {}),
                              "kv_timeout": ("pd_proxy_upstream_errors_total", {"kind": "kv_timeout"})}  # fmt: skip
    return {
        key: sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())
        for key, (name, labels) in wanted.items()
    }


def test_the_kv_transfer_config_carries_the_load_failure_policy(cp: ControlPlane, deployed: str) -> None:
    for name, (_, policy) in CASES.items():
        for container in serving_pod(cp, deployed, name)["spec"]["containers"]:
            if container["name"] not in ("prefill", "decode"):
                continue
            argv = [*container.get("command", []), *container.get("args", [])]
            config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert config["kv_load_failure_policy"] == policy, (name, container["name"], config)
            assert config["kv_connector_extra_config"]["defer_timeout"] == DEFER_TIMEOUT_S
            assert ("--sim-drop-notify" in argv) == (container["name"] == "prefill")


@pytest.mark.parametrize("stream", [True, False])
def test_write_failed_is_a_clear_error_within_the_kv_wait(cp: ControlPlane, deployed: str, stream: bool) -> None:
    ip = pod_ip(cp, "fail-033")
    before = proxy_counters(ip)
    status, body = complete(ip, stream)
    assert status == 502 and body["error"]["code"] == "kv_load_failed", body
    assert "write_failed" in body["error"]["message"]
    after = proxy_counters(ip)
    assert after["kv_load_failures"] == before["kv_load_failures"] + 1, (before, after)
    assert after["kv_timeout"] == before["kv_timeout"], (before, after)


@pytest.mark.parametrize("stream", [True, False])
def test_recompute_serves_the_whole_answer(cp: ControlPlane, deployed: str, stream: bool) -> None:
    ip = pod_ip(cp, "recompute-033")
    status, body = complete(ip, stream)
    assert status == 200, body
    (choice,) = body["choices"]
    assert len(choice["token_ids"]) == MAX_TOKENS and choice["finish_reason"] == "length", body
    assert proxy_counters(ip) == {"kv_load_failures": 0, "kv_timeout": 0}


def test_before_0_33_decode_waits_for_the_kv_wait(cp: ControlPlane, deployed: str) -> None:
    ip = pod_ip(cp, "fail-032")
    status, body = complete(ip, True)
    assert status == 502 and body["error"]["code"] == "kv_transfer_timeout", body
    assert proxy_counters(ip) == {"kv_load_failures": 0, "kv_timeout": 1}
