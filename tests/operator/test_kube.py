"""kube.py over real HTTP against kmock's Kubernetes emulator (no control plane needed)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from pd_operator import layout, render
from pd_operator.kube import APPLY_PATCH, Kube, KubeError, collection_path
from pd_operator.validation import validate_spec

OWNER = layout.Owner(name="demo", namespace="ns1", uid="uid-1")
LAYOUT = layout.build(OWNER, validate_spec({"model": "m", "engine": "simulated"}))


@pytest.fixture
def kube(kmock: Any) -> Kube:
    configuration = client.Configuration(host=str(kmock.url).rstrip("/"))
    return Kube(client.ApiClient(configuration))


def test_collection_paths() -> None:
    assert collection_path("Pod", "a") == "/api/v1/namespaces/a/pods"
    assert collection_path("Job", "a") == "/apis/batch/v1/namespaces/a/jobs"
    assert collection_path("NetworkPolicy", "a") == "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies"


async def test_apply_is_one_server_side_apply_request_under_the_field_manager(kmock: Any, kube: Kube) -> None:
    """The request's shape; what the API server makes of it (create, repair, no-op) is exercised in e2e."""
    await kube.create(render.service(LAYOUT))
    drifted = layout.build(OWNER, validate_spec({"model": "m", "engine": "simulated", "proxy": {"port": 9000}}))
    await kube.apply(render.service(drifted))
    request = list(kmock)[-1]
    assert (request.method, request.headers["Content-Type"]) == ("PATCH", APPLY_PATCH)
    assert dict(request.params) == {"fieldManager": "pd-operator", "force": "true"}
    live = await kube.get("Service", "ns1", "demo")
    assert live is not None and live["spec"]["ports"][0]["port"] == 9000


async def test_create_of_an_existing_object_is_not_an_error(kube: Kube) -> None:
    pod = render.pod(LAYOUT)
    assert await kube.create(pod) is not None
    assert await kube.create(pod) is None


async def test_get_and_delete_of_missing_objects(kube: Kube) -> None:
    assert await kube.get("Pod", "ns1", "nothing") is None
    assert await kube.delete("Job", "ns1", "nothing") is False
    job = render.probe_job(LAYOUT, "demo-goodput-1")
    await kube.create(job)
    assert await kube.get("Job", "ns1", "demo-goodput-1") is not None
    assert await kube.delete("Job", "ns1", "demo-goodput-1") is True
    assert await kube.get("Job", "ns1", "demo-goodput-1") is None


async def test_unreachable_server_raises_kube_error() -> None:
    kube = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    with pytest.raises(KubeError) as err:
        await kube.get("Pod", "ns1", "x")
    assert err.value.status == 0


async def test_a_refusal_keeps_the_servers_status(kmock: Any, kube: Kube) -> None:
    """The Status body (reason, message, causes) travels in the error, for refusals.py to read."""
    status = {"kind": "Status", "reason": "Forbidden", "message": 'pods "demo" is forbidden: nope', "code": 403}
    kmock["post /api/v1/namespaces/ns1/pods"] << 403 << status
    with pytest.raises(KubeError) as err:
        await kube.create(render.pod(LAYOUT))
    assert err.value.failure.code == 403 and err.value.failure.reason == "Forbidden"
    assert err.value.failure.message == 'pods "demo" is forbidden: nope'
