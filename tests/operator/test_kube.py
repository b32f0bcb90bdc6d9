"""kube.py over real HTTP against kmock's Kubernetes emulator (no control plane needed)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from pd_operator import render
from pd_operator.kube import Kube, KubeError, collection_path, is_subset, merge_patch_for
from pd_operator.validation import validate_spec

OWNER = render.Owner(name="demo", namespace="ns1", uid="uid-1")
SPEC = validate_spec({"model": "m", "engine": "simulated"})


@pytest.fixture
def kube(kmock: Any) -> Kube:
    configuration = client.Configuration(host=str(kmock.url).rstrip("/"))
    return Kube(client.ApiClient(configuration))


def test_collection_paths() -> None:
    assert collection_path("Pod", "a") == "/api/v1/namespaces/a/pods"
    assert collection_path("Job", "a") == "/apis/batch/v1/namespaces/a/jobs"
    assert collection_path("NetworkPolicy", "a") == "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies"


def test_subset_ignores_server_added_fields() -> None:
    desired = {"spec": {"ports": [{"port": 1}]}}
    assert is_subset(desired, {"spec": {"ports": [{"port": 1, "nodePort": 3}], "clusterIP": "x"}})
    assert not is_subset(desired, {"spec": {"ports": [{"port": 2}]}})
    assert not is_subset(desired, {"spec": {"ports": [{"port": 1}, {"port": 2}]}})


def test_merge_patch_owns_labels_owner_references_and_spec() -> None:
    patch = merge_patch_for(render.service(OWNER, SPEC))
    assert set(patch) == {"metadata", "spec"} and set(patch["metadata"]) == {"labels", "ownerReferences"}


async def test_ensure_creates_then_leaves_alone_then_repairs(kube: Kube) -> None:
    service = render.service(OWNER, SPEC)
    assert await kube.ensure(service) == "created"
    assert await kube.ensure(service) == "unchanged"
    drifted = render.service(OWNER, validate_spec({"model": "m", "engine": "simulated", "proxy": {"port": 9000}}))
    assert await kube.ensure(drifted) == "patched"
    live = await kube.get("Service", "ns1", "demo")
    assert live is not None and live["spec"]["ports"][0]["port"] == 9000


async def test_create_of_an_existing_object_is_not_an_error(kube: Kube) -> None:
    pod = render.pod(OWNER, SPEC)
    assert await kube.create(pod) is not None
    assert await kube.create(pod) is None


async def test_get_and_delete_of_missing_objects(kube: Kube) -> None:
    assert await kube.get("Pod", "ns1", "nothing") is None
    assert await kube.delete("Job", "ns1", "nothing") is False
    job = render.probe_job(OWNER, SPEC, "demo-goodput-1")
    await kube.create(job)
    assert [j["metadata"]["name"] for j in await kube.list("Job", "ns1", "app.kubernetes.io/instance=demo")] == [
        "demo-goodput-1"
    ]
    assert await kube.delete("Job", "ns1", "demo-goodput-1") is True
    assert await kube.get("Job", "ns1", "demo-goodput-1") is None


async def test_unreachable_server_raises_kube_error() -> None:
    kube = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    with pytest.raises(KubeError) as err:
        await kube.get("Pod", "ns1", "x")
    assert err.value.status == 0
