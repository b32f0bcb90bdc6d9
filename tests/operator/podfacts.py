"""Builders of the pod, Job and proxy documents the operator observes (as the kubelet and proxy write them)."""

from __future__ import annotations

import json
from typing import Any

from pd_operator import render


def container_status(
    name: str, ready: bool = True, restarts: int = 0, waiting: str | None = None, last_message: str = ""
) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": {"reason": waiting}} if waiting else {"running": {"startedAt": "t"}}
    cs: dict[str, Any] = {"name": name, "ready": ready, "started": ready, "restartCount": restarts, "state": state}
    if last_message:
        cs["lastState"] = {"terminated": {"exitCode": 78, "reason": "Error", "message": last_message}}
    return cs


def running_pod(
    pod: dict[str, Any],
    ready: bool = True,
    ip: str = "10.1.2.3",
    uid: str = "pod-uid-1",
    statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The rendered pod as the API server returns it once scheduled and running."""
    names = [c["name"] for c in pod["spec"]["containers"]]
    out = json.loads(json.dumps(pod))
    out["metadata"]["uid"] = uid
    out["spec"]["nodeName"] = "mi300x-0"
    out["status"] = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": statuses if statuses is not None else [container_status(n, ready) for n in names],
    }
    return out


KV_MISMATCH = {
    "at": "2026-11-29T08:05:00.000Z",
    "transfer_id": "tx-9",
    "prefill": "10.1.2.3:20005",
    "decode": "10.1.2.3:40005",
    "position": 3,
    "expected": 17,
    "got": 4,
    "compared": 8,
    "message": "decode's tokens after KV transfer tx-9 differ from prefill's own at token 3 (counting from 0; ...)",
}


ENGINE_RELEASE = "0.31.0+rocm723"


def proxy_status(transfer: bool = True, mismatch: bool = False) -> dict[str, Any]:
    last = {
        "transfer_id": "tx-1",
        "completed_at": "2026-11-29T08:00:00Z",
        "prefill": "10.1.2.3:20005",
        "decode": "10.1.2.3:40005",
        "source": "request",
    }
    return {
        "mode": "disaggregated",
        "transfer_mode": "write",
        "instances": [  # the default layout's engines, with the release their GET /version answered
            {"role": "P", "http_address": "10.1.2.3:20005", "vllm_version": ENGINE_RELEASE},
            {"role": "D", "http_address": "10.1.2.3:40005", "vllm_version": ENGINE_RELEASE},
        ],
        "counts": {},
        "last_transfer": last if transfer else None,
        "canary": {"enabled": True, "kv_mismatch": KV_MISMATCH} if mismatch else {"enabled": False},
    }


def summary(attainment: float = 0.73, rate: float = 8.0) -> dict[str, Any]:
    requests = 100
    return {
        "schema": "pd.serving.dev/bench-summary/v1",
        "time": "2026-11-29T08:00:00Z",
        "model": "m",
        "rate": rate,
        "requests": requests,
        "good": int(attainment * requests),
        "errors": 0,
        "attainment": attainment,
        "attainment_ci": [attainment - 0.09, attainment + 0.07],
        "ttft_ms": {"p50": 300.0, "p90": 800.0, "p99": 1500.0, "mean": 400.0},
        "itl_ms": {"p50": 30.0, "p90": 45.0, "p99": 60.0, "mean": 33.0},
        "slo": {"ttft_ms": 1000.0, "itl_ms": 50.0, "target": 0.9},
        "goodput_rate": None,
        "duration_s": 20.0,
    }


def finished_job(job: dict[str, Any], message: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Job with a Complete condition, its pod whose bench container ended with `message`), with the uids
    the API server gives them and the pod's controller reference to its Job, as the Job controller sets it."""
    name = job["metadata"]["name"]
    done = json.loads(json.dumps(job))
    done["metadata"]["uid"] = f"uid-{name}"
    done["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    terminated: dict[str, Any] = {"exitCode": 0}
    if message is not None:
        terminated["message"] = message
    labels = {**job["spec"]["template"]["metadata"]["labels"], "job-name": name}
    controller = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"uid-{name}", "controller": True}
    pod = {
        "metadata": {
            "name": f"{name}-abcde",
            "uid": f"uid-{name}-abcde",
            "labels": labels,
            "ownerReferences": [controller],
            "creationTimestamp": "2026-11-29T08:00:00Z",
        },
        "status": {"containerStatuses": [{"name": render.BENCH_CONTAINER, "state": {"terminated": terminated}}]},
    }
    return done, pod
