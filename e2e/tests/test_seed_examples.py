"""The seed's own examples (`engine: vllm`), applied as written, serve through the real launcher preflight.

The node agent emulates what a real MI300X node gives a pod (devices.py): /dev/kfd and the allocated
GPUs' /dev/dri nodes per container, /dev/infiniband and the RDMA sysfs class for the RDMA resource, a
host network namespace of its own. `vllm serve` is the e2e shim: the simulated engine with the very same
argv (calibrated Qwen3-235B profile, time-scaled), behind the very same `pdctl engine` preflight.

Only the model storage changes: the examples name a PersistentVolumeClaim `models`, which the agent does
not emulate, so the tests swap it for a hostPath volume at the same mount path (a directory of the
emulated node). Each example needs all 8 GPUs of the node, so they run one after the other.

A second node whose RDMA plugin advertises its resource without any uverbs device (ib_uverbs not loaded)
shows what a refused preflight looks like to the user: its reason in a condition and an Event.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.procs import stop
from e2e.stack import MISCONFIGURED_TAINT, NODE_NAME, Stack
from e2e.tests.kube import (
    Obj,
    apply,
    condition,
    create_namespace,
    get,
    pdd,
    pod,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)
from e2e.tests.rogue import check_rogue_gets_nothing

SEED_EXAMPLES = ["write", "read", "colocated"]
SERVING_CONDITIONS = {
    "write": ["PrefillReady", "DecodeReady", "ProxyReady", "Ready", "KVTransferVerified"],
    "read": ["PrefillReady", "DecodeReady", "ProxyReady", "Ready", "KVTransferVerified"],
    "colocated": ["EngineReady", "ProxyReady", "Ready"],
}
MISCONFIGURED_NODE = "mi300x-no-uverbs"


def seed_example(mode: str) -> Obj:
    """The example as written, with its PVC swapped for a hostPath the agent supports (same mount path)."""
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / f"qwen3-235b-{mode}.yaml").read_text())
    storage = obj["spec"]["modelStorage"]
    assert storage.pop("persistentVolumeClaim") == "models", "the seed examples keep the weights on a PVC"
    storage["hostPath"] = "/models"
    return obj


def engine_http_ports(serving: Obj) -> list[int]:
    """The engines' vLLM HTTP ports (named <prefix>-http) of the serving pod."""
    return [
        port["containerPort"]
        for c in serving["spec"]["containers"]
        if c["name"] != "proxy"
        for port in c.get("ports", [])
        if port["name"].endswith("-http")
    ]


def engine_names(obj: Obj) -> list[str]:
    return ["engine-0", "engine-1"] if obj["spec"].get("mode") == "colocated" else ["prefill", "decode"]


def wait_pod_gone(cp: ControlPlane, namespace: str, name: str) -> None:
    """The pod and its devices are released (the next example needs every GPU of the node)."""
    wait_for(lambda: pod(cp, namespace, name) is None, 90, f"pod {namespace}/{name} gone")


def condition_true(cp: ControlPlane, namespace: str, name: str, kind: str) -> bool:
    return (condition(pdd(cp, namespace, name), kind) or {}).get("status") == "True"


def pdd_events(cp: ControlPlane, namespace: str, name: str) -> list[Obj]:
    selector = f"involvedObject.kind=PDDeployment,involvedObject.name={name}"
    listing = get(cp, f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}") or {}
    items: list[Obj] = listing.get("items", [])
    return items


# ---- a node whose RDMA plugin mounts no uverbs device --------------------------------------------------

REFUSED, REFUSED_NAMESPACE = "no-uverbs", "seed-refused"


@pytest.fixture(scope="module")
def refused_deployment(operator: Stack) -> Iterator[str]:
    """A second MI300X node without uverbs devices, tainted so that only this variant of the read example
    lands there; applied before the examples run, so that its refusal happens meanwhile."""
    cp = operator.cp
    taint = f"{MISCONFIGURED_TAINT}=no-uverbs:NoSchedule"
    ref = operator.start_agent(MISCONFIGURED_NODE, extra_args=("--no-uverbs", f"--register-with-taint={taint}"))
    obj = seed_example("read")  # declares rdma/hca_shared_devices_a, which the node advertises
    obj["metadata"]["name"] = REFUSED
    obj["spec"]["node"] = {
        "nodeSelector": {"kubernetes.io/hostname": MISCONFIGURED_NODE},
        "tolerations": [{"key": MISCONFIGURED_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    create_namespace(cp, REFUSED_NAMESPACE, "privileged")  # engine vllm: see docs/gpu-allocation.md
    apply(cp, json.dumps(obj), REFUSED_NAMESPACE)
    yield REFUSED_NAMESPACE
    cp.kubectl("delete", "pdd", REFUSED, "-n", REFUSED_NAMESPACE, "--wait=false", check=False)
    wait_pod_gone(cp, REFUSED_NAMESPACE, REFUSED)  # while the node's agent still runs to finalize it
    cp.kubectl("delete", "namespace", REFUSED_NAMESPACE, "--wait=false", check=False)
    stop(ref)
    cp.kubectl("delete", "node", MISCONFIGURED_NODE, "--wait=false", check=False)


@pytest.mark.usefixtures("refused_deployment")
@pytest.mark.parametrize("mode", SEED_EXAMPLES)
def test_seed_example_serves_through_the_real_preflight(
    operator: Stack, cp: ControlPlane, mode: str, tmp_path: Path
) -> None:
    obj = seed_example(mode)
    name, namespace = obj["metadata"]["name"], f"seed-{mode}"
    create_namespace(cp, namespace, "privileged")  # engine vllm with a hostPath model: privileged
    try:
        apply(cp, json.dumps(obj), namespace)
        status = wait_pdd_ready(cp, namespace, name, timeout_s=150)["status"]
        serving = pod(cp, namespace, status["podName"])
        assert serving is not None and serving["spec"]["nodeName"] == NODE_NAME
        address = serving["status"]["podIP"]
        api_port = obj["spec"].get("proxy", {}).get("port", 8000)
        assert stream_completion(address, api_port)
        if serving["spec"].get("hostNetwork"):
            assert address == serving["status"]["hostIP"], "a hostNetwork pod has the node's address"
            for port in engine_http_ports(serving):  # on the node's loopback only (docs/security.md)
                with pytest.raises(httpx.ConnectError):
                    httpx.get(f"http://{address}:{port}/health", timeout=5, trust_env=False)
            # the proxy's loopback is the node's: a rogue process on the node gets no request either
            check_rogue_gets_nothing(operator, serving, tmp_path, api_port)
        for kind in SERVING_CONDITIONS[mode]:
            wait_for(functools.partial(condition_true, cp, namespace, name, kind), 60, f"{kind} True")
        for engine in engine_names(obj):
            container = next(c for c in serving["spec"]["containers"] if c["name"] == engine)
            assert container["command"][:2] == ["pdctl", "engine"] and "vllm" in container["command"]
            log = cp.kubectl("logs", "-n", namespace, status["podName"], "-c", engine)
            assert f"preflight passed for the {engine.split('-')[0]} engine" in log, log[-2000:]
    finally:
        cp.kubectl("delete", "pdd", "--all", "-n", namespace, "--wait=false", check=False)
        wait_pod_gone(cp, namespace, name)
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_refused_preflight_shows_in_status_and_events(cp: ControlPlane, refused_deployment: str) -> None:
    namespace, name = refused_deployment, REFUSED

    def refused() -> Obj | None:
        found = condition(pdd(cp, namespace, name), "PrefillReady") or {}
        return found if found.get("reason") == "PreflightFailed" else None

    prefill = wait_for(refused, 90, "PrefillReady reason PreflightFailed")
    assert prefill["status"] == "False"
    assert "preflight failed for the prefill engine" in prefill["message"]
    assert "no /dev/infiniband/uverbs* device" in prefill["message"], prefill["message"]
    assert (condition(pdd(cp, namespace, name), "DecodeReady") or {}).get("reason") == "PreflightFailed"
    events = wait_for(
        lambda: [e for e in pdd_events(cp, namespace, name) if e["reason"] == "PreflightFailed"],
        30,
        "a PreflightFailed Event",
    )
    assert events[0]["type"] == "Warning" and "uverbs" in events[0]["message"]
    status = wait_for(lambda: degraded(cp, namespace, name), 60, "phase Degraded")
    assert "uverbs" in status["message"]


def degraded(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    status: Obj = (pdd(cp, namespace, name) or {}).get("status") or {}
    return status if status.get("phase") == "Degraded" else None
