"""Small synchronous helpers the tests share: waiting, reading objects, applying YAML."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import httpx

from e2e.cluster import ControlPlane

T = TypeVar("T")
Obj = dict[str, Any]


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.3) -> T:
    """Poll until `check` returns something truthy; the error says what was awaited and the last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:  # the object may not exist yet
            last = err
        else:
            if last:
                found: T = last
                return found
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {str(last)[:2000]}")


def get(cp: ControlPlane, path: str) -> Obj | None:
    with cp.http() as client:
        resp = client.get(path)
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    result: Obj = resp.json()
    return result


def pod(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    return get(cp, f"/api/v1/namespaces/{namespace}/pods/{name}")


def pods(cp: ControlPlane, namespace: str, selector: str = "") -> list[Obj]:
    query = f"?labelSelector={selector}" if selector else ""
    listing = get(cp, f"/api/v1/namespaces/{namespace}/pods{query}") or {}
    items: list[Obj] = listing.get("items", [])
    return items


def ready_pod(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    """The pod if its Ready condition is True."""
    obj = pod(cp, namespace, name)
    return obj if is_true(obj, "Ready") else None


def condition(obj: Obj | None, kind: str) -> Obj | None:
    for cond in (obj or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Obj | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return bool(cond and cond.get("status") == "True")


def container_status(obj: Obj | None, name: str) -> Obj:
    for status in (obj or {}).get("status", {}).get("containerStatuses", []) or []:
        if status["name"] == name:
            return dict(status)
    return {}


PodSecurityLevel = Literal["privileged", "baseline", "restricted"]
POD_SECURITY = "pod-security.kubernetes.io"


def pod_security_labels(enforce: PodSecurityLevel) -> dict[str, str]:
    """The labels a cluster admin sets: enforce a level, warn and audit against restricted (the usual rollout)."""
    return {
        f"{POD_SECURITY}/enforce": enforce,
        f"{POD_SECURITY}/warn": "restricted",
        f"{POD_SECURITY}/audit": "restricted",
    }


def create_namespace(cp: ControlPlane, name: str, enforce: PodSecurityLevel = "baseline") -> str:
    """A namespace labelled for Pod Security admission as a user would label it; returns its name."""
    manifest: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    manifest["metadata"]["labels"] = pod_security_labels(enforce)
    cp.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    return name


def apply(cp: ControlPlane, manifest: str, namespace: str) -> str:
    return cp.kubectl("apply", "-n", namespace, "-f", "-", input_text=manifest)


GROUP_PATH = "/apis/pd.serving.dev/v1alpha1"


def pdd(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    return get(cp, f"{GROUP_PATH}/namespaces/{namespace}/pddeployments/{name}")


def phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase", ""))


def wait_pdd_ready(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 120) -> Obj:
    """Ready phase for the current generation (so a stale Ready from before a change does not count)."""

    def ready() -> Obj | None:
        obj = pdd(cp, namespace, name)
        if obj is None or phase(obj) != "Ready":
            return None
        observed = obj["status"].get("observedGeneration")
        return obj if observed == obj["metadata"]["generation"] else None

    return wait_for(ready, timeout_s, f"PDDeployment {namespace}/{name} Ready")


def stream_completion(pod_ip: str, port: int = 8000) -> str:
    """A streamed completion through the proxy's API port; returns the generated text."""
    base = f"http://{pod_ip}:{port}"
    model = httpx.get(f"{base}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Disaggregate prefill and decode.", "max_tokens": 8, "stream": True}
    chunks: list[str] = []
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60, trust_env=False) as resp:
        assert resp.status_code == 200, resp.read()
        chunks = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert chunks and chunks[-1] == "[DONE]", chunks
    return "".join(json.loads(c)["choices"][0].get("text", "") for c in chunks[:-1])
