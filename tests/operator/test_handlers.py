"""reconcile() end to end over HTTP against kmock's Kubernetes emulator, with the proxy report injected.

The kopf indexes are emulated by passing the pods and Jobs in the Target, exactly what kopf hands over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from pd_operator import handlers, render
from pd_operator.api import RUN_PROBE_ANNOTATION
from pd_operator.handlers import Deps, Target, reconcile
from pd_operator.kube import Kube
from pd_operator.observe import ProxyReport
from pd_operator.validation import validate_spec
from tests.operator.podfacts import finished_job, proxy_status, running_pod, summary

NS, NAME, UID = "ns1", "demo", "uid-1"
SPEC: dict[str, Any] = {"model": "m", "engine": "simulated", "goodputProbe": {"enabled": True}}
T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def kube(kmock: Any) -> Kube:
    return Kube(client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/"))))


@pytest.fixture
def world(kube: Kube) -> tuple[Deps, Clock, list[str]]:
    clock, polled = Clock(), []

    async def proxy(url: str) -> ProxyReport:
        polled.append(url)
        return ProxyReport(status=proxy_status())

    return Deps(kube=kube, fetch_proxy_status=proxy, now=clock), clock, polled


def target(spec: dict[str, Any] = SPEC, status: dict[str, Any] | None = None, **kw: Any) -> Target:
    return Target(name=NAME, namespace=NS, uid=UID, generation=1, spec=spec, status=status or {}, **kw)


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def owner() -> render.Owner:
    return render.Owner(NAME, NS, UID, 1)


async def test_create_makes_children_and_reports_pending(world: Any, kube: Kube) -> None:
    deps, _, _ = world
    result = await reconcile(target(), deps)
    for kind in ("Service", "NetworkPolicy", "Pod"):
        obj = await kube.get(kind, NS, NAME)
        assert obj is not None, kind
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
    assert result.status["phase"] == "Pending"
    assert [e.reason for e in result.events][:2] == ["CreatedPod", "Pending"]


async def test_invalid_object_gets_spec_valid_false_and_no_children(world: Any, kube: Kube) -> None:
    deps, _, _ = world
    result = await reconcile(target({"model": "m", "prefill": {"gpus": "9-0"}}), deps)
    assert result.status["phase"] == "Failed"
    assert cond(result.status, "SpecValid")["status"] == "False"
    assert [e.reason for e in result.events] == ["Failed", "InvalidSpec"]
    assert await kube.get("Pod", NS, NAME) is None


async def ready_status(deps: Deps, pods: list[dict[str, Any]], spec: dict[str, Any] = SPEC) -> dict[str, Any]:
    first = await reconcile(target(spec, pods=pods), deps)
    return first.status


async def test_ready_pod_starts_a_probe_and_verifies_kv_transfer(world: Any, kube: Kube) -> None:
    deps, _, polled = world
    pod = running_pod(render.pod(owner(), validate_spec(SPEC)))
    await kube.create(pod)
    status = await ready_status(deps, [pod])
    assert status["phase"] == "Ready"
    assert polled == ["http://10.1.2.3:8001/status"]
    assert cond(status, "KVTransferVerified")["status"] == "True"
    job_name = status["probe"]["jobName"]
    assert status["probe"]["trigger"] == "ready"
    job = await kube.get("Job", NS, job_name)
    assert job is not None and job["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["pdctl", "bench"]


async def run_probe_to_completion(deps: Deps, kube: Kube, clock: Clock, message: str | None) -> Any:
    pod = running_pod(render.pod(owner(), validate_spec(SPEC)))
    await kube.create(pod)
    status = await ready_status(deps, [pod])
    job = await kube.get("Job", NS, status["probe"]["jobName"])
    assert job is not None
    done, job_pod = finished_job(job, message)
    clock.now = T0 + timedelta(seconds=30)
    result = await reconcile(target(status=status, pods=[pod, job_pod], jobs=[done]), deps)
    return result, {**status, **result.status}, job["metadata"]["name"]


async def test_finished_probe_fills_status_goodput_and_is_cleaned_up(world: Any, kube: Kube) -> None:
    deps, clock, _ = world
    result, status, job_name = await run_probe_to_completion(deps, kube, clock, json.dumps(summary(0.95)))
    assert status["goodput"]["attainment"] == 0.95 and status["goodput"]["summary"] == "95% @8/s"
    assert cond(status, "GoodputMet")["status"] == "True"
    assert status["probe"]["jobName"] is None and status["probe"]["lastFinishedAt"] == "2026-11-29T08:00:30Z"
    assert await kube.get("Job", NS, job_name) is None
    assert {"GoodputMeasured", "GoodputMet"} <= {e.reason for e in result.events}


async def test_missed_target_and_failed_probe(world: Any, kube: Kube) -> None:
    deps, clock, _ = world
    _, status, _ = await run_probe_to_completion(deps, kube, clock, json.dumps(summary(0.29)))
    assert cond(status, "GoodputMet")["status"] == "False"


async def test_probe_without_summary_records_the_error(world: Any, kube: Kube) -> None:
    deps, clock, _ = world
    result, status, _ = await run_probe_to_completion(deps, kube, clock, None)
    assert "without a summary" in status["probe"]["lastError"] and "goodput" not in status
    assert "GoodputProbeFailed" in {e.reason for e in result.events}


async def test_annotation_runs_a_probe_on_demand(world: Any, kube: Kube) -> None:
    deps, clock, _ = world
    _, status, _ = await run_probe_to_completion(deps, kube, clock, json.dumps(summary()))
    pod = running_pod(render.pod(owner(), validate_spec(SPEC)))
    quiet = await reconcile(target(status=status, pods=[pod]), deps)
    assert "jobName" not in quiet.status.get("probe", {})
    asked = await reconcile(target(status=status, pods=[pod], annotations={RUN_PROBE_ANNOTATION: "now"}), deps)
    assert asked.status["probe"]["trigger"] == "annotation" and asked.status["probe"]["lastAnnotation"] == "now"


async def test_spec_change_rolls_the_pod(world: Any, kube: Kube) -> None:
    deps, _, _ = world
    old = running_pod(render.pod(owner(), validate_spec(SPEC)))
    await kube.create(old)
    result = await reconcile(target({**SPEC, "image": "other:2"}, pods=[old]), deps)
    assert "RollingPod" in {e.reason for e in result.events}
    assert result.status["phase"] == "Progressing" and "observedGeneration" not in result.status
    assert await kube.get("Pod", NS, NAME) is None


async def test_deleted_pod_is_recreated(world: Any, kube: Kube) -> None:
    deps, _, _ = world
    first = await reconcile(target(), deps)
    await kube.delete("Pod", NS, NAME)
    again = await reconcile(target(status=first.status), deps)
    assert "CreatedPod" in {e.reason for e in again.events}
    assert await kube.get("Pod", NS, NAME) is not None


async def test_steady_state_writes_nothing(world: Any, kube: Kube) -> None:
    deps, _, polled = world
    spec = {"model": "m", "engine": "simulated"}
    pod = running_pod(render.pod(owner(), validate_spec(spec)))
    await kube.create(pod)
    first = await reconcile(target(spec, pods=[pod]), deps)
    second = await reconcile(target(spec, status=first.status, pods=[pod]), deps)
    assert second.status == {} and second.events == []
    assert len(polled) == 1, "a verified pod is not polled again"


async def test_api_errors_become_status_not_exceptions(world: Any) -> None:
    deps, _, _ = world
    broken: Callable[..., Any] = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    result = await reconcile(target(), Deps(kube=broken, fetch_proxy_status=deps.fetch_proxy_status))
    assert result.status["phase"] == "Pending" and "cannot create the serving pod" in result.status["message"]


async def test_proxy_poll_failure_is_a_report(unused_tcp_port: int) -> None:
    report = await handlers.fetch_proxy_status(f"http://127.0.0.1:{unused_tcp_port}/status")
    assert report.status is None and report.error
