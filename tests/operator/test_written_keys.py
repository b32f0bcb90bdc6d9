"""Every key the operator writes exists where it is written, so the API server never prunes one silently.

A status key missing from the CRD schema is pruned on write; the operator then sees it missing, writes
it again on every tick, and the deployment never reaches a steady state (status.podIP once cost 1,082
patches a minute for 100 deployments). A child field unknown to Kubernetes is dropped the same way.
This walks every status and patch the core decides, and every child it renders, for every example and
generated variants, through the life of a deployment: against crds/pddeployment.yaml for the status
and against the Kubernetes client's own models (their OpenAPI attribute maps) for the children.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes import client

from pd_operator import decide, layout, render
from pd_operator.actions import Apply, Create, Decision
from pd_operator.api import RUN_PROBE_ANNOTATION
from pd_operator.observe import ProxyReport, RouterRead, wire
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError, validate_spec
from pd_operator.views import DeploymentView, job_view, pod_view
from tests.operator.conftest import DRA, EXAMPLES, REPO, WIDE_POLICY
from tests.operator.podfacts import container_status, finished_job, proxy_status, running_pod, summary
from tests.operator.test_decide import planned

T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
Obj = dict[str, Any]


# ---- what the keys are checked against ------------------------------------------------------------------


def status_schema() -> Obj:
    crd = yaml.safe_load((REPO / "crds" / "pddeployment.yaml").read_text())
    schema: Obj = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def unknown_in_schema(value: Any, schema: Obj, path: str = "status", full: bool = True) -> list[str]:
    """Keys of ``value`` the structural schema would prune, and (``full``) defaulted keys the server would add.

    A key the server adds by defaulting differs from what the operator computed, just like a pruned one.
    Merge patches are partial by design, so they are checked for unknown keys only.
    """
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, list):
        items = schema.get("items", {})
        return [p for i, v in enumerate(value) for p in unknown_in_schema(v, items, f"{path}[{i}]", full)]
    if not isinstance(value, dict):
        return []
    if "properties" not in schema:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return [p for k, v in value.items() for p in unknown_in_schema(v, extra, f"{path}.{k}", full)]
        return [f"{path}.{k}" for k in value] if not extra else []
    props = schema["properties"]
    found = [f"{path}.{k} (not in the schema)" for k in value if k not in props]
    if full:
        found += [
            f"{path}.{k} (defaulted by the server)" for k, p in props.items() if "default" in p and k not in value
        ]
    nested = [unknown_in_schema(v, props[k], f"{path}.{k}", full) for k, v in value.items() if k in props]
    return found + [p for keys in nested for p in keys]


MODELS = {
    "Pod": client.V1Pod,
    "Service": client.V1Service,
    "ConfigMap": client.V1ConfigMap,
    "Secret": client.V1Secret,
    "NetworkPolicy": client.V1NetworkPolicy,
    "Job": client.V1Job,
    "ResourceClaimTemplate": client.V1ResourceClaimTemplate,
    "PodDisruptionBudget": client.V1PodDisruptionBudget,
    "Deployment": client.V1Deployment,
    "ServiceAccount": client.V1ServiceAccount,
    "Role": client.V1Role,
    "RoleBinding": client.V1RoleBinding,
}
_CONTAINER = re.compile(r"^(List|Dict)\[(?:str, )?(.+)\]$")


def unknown_in_model(value: Any, type_name: str, path: str) -> list[str]:
    """Keys of ``value`` the Kubernetes type ``type_name`` (as the client's OpenAPI maps spell it) lacks."""
    container = _CONTAINER.match(type_name)
    if container:
        kind, inner = container.groups()
        items = enumerate(value) if kind == "List" else value.items()
        return [p for k, v in items for p in unknown_in_model(v, inner, f"{path}[{k}]")]
    model = getattr(client, type_name, None)
    if model is None or not isinstance(value, dict):  # str, int, bool, object (IntOrString, quantities)
        return []
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    found = [f"{path}.{k}" for k in value if k not in by_key]
    return found + [
        p
        for k, v in value.items()
        if k in by_key
        for p in unknown_in_model(v, model.openapi_types[by_key[k]], f"{path}.{k}")
    ]


# ---- what the operator writes ---------------------------------------------------------------------------


def variants(spec: Obj) -> Iterator[Obj]:
    """The example and versions that switch on every optional part of the objects and the status."""
    changes: list[Obj] = [
        {},
        {"goodputProbe": {"enabled": True, "search": True, "seed": 7}},
        {"gpuAllocation": {"strategy": "hostDevices"}},
        {"gpuAllocation": DRA},
        {"modelStorage": {"persistentVolumeClaim": "models", "hubTokenSecret": {"name": "hf"}, "readOnly": True}},
        {"modelStorage": {"hostPath": "/data/hf"}},
        {"proxy": {"apiKeySecret": {"name": "key"}, "heartbeatTtlSeconds": 9, "timeouts": {"idleSeconds": 30}}},
        {"node": {"tolerations": [{"key": "gpu", "operator": "Exists"}], "priorityClassName": "high"}},
        {"kvTransfer": {"rdma": {"resourceName": "rdma/hca", "hostNetwork": True}}},
        {"simulation": {"reserveGpus": True}},
        {"replicas": 3, "rollout": {"maxUnavailable": 2}},
        {"autotune": {"enabled": True, "maxTrials": 2}, "goodputProbe": {"enabled": True}},
        {"replicas": 2, "router": {"enabled": True}},
    ]
    for change in changes:
        doc = copy.deepcopy(spec)
        for key, value in change.items():
            doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
        yield doc


def valid_variants() -> list[tuple[str, Obj]]:
    out = []
    for path in EXAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        for i, doc in enumerate(variants(spec)):
            try:
                validate_spec(doc)
            except SpecError:
                continue
            out.append((f"{path.stem}-{i}", doc))
    return out


VARIANTS = valid_variants()


def snap(spec: Obj, status: Obj, pods: list[Obj] = (), jobs: list[Obj] = (), **kw: Any) -> Snapshot:  # type: ignore[assignment]
    annotations = kw.pop("annotations", {})
    kw.setdefault("router", RouterRead(DeploymentView("demo-router", 1, 1, 1)))  # read only with spec.router
    deployment = Deployment("demo", "ns1", "uid-1", 3, spec, status, annotations, tenancy=WIDE_POLICY)
    views = [pod_view(p) for p in pods], [job_view(j) for j in jobs]
    return planned(Snapshot(deployment, kw.pop("now", T0), *views, **kw))


def life(spec: Obj) -> Iterator[Decision]:
    """The decisions of one deployment's life: created, running, ready, probed, crashed, rolled, terminated."""
    enabled = {**spec, "goodputProbe": {**spec.get("goodputProbe", {}), "enabled": True}}
    first = decide.decide(snap(enabled, {}))
    yield first
    pods = [running_pod(a.obj) for a in first.actions if isinstance(a, Create)]
    pod = pods[0]
    starting = decide.decide(snap(enabled, wire(first.status), [running_pod(pod, ready=False)]))
    yield starting
    reports = {p["metadata"]["name"]: ProxyReport(status=proxy_status()) for p in pods}
    ready = decide.decide(snap(enabled, wire(starting.status), pods, proxies=reports))
    yield ready
    job = next(a.obj for a in ready.actions if isinstance(a, Create) and a.obj["kind"] == "Job")
    for message in (json.dumps(summary(0.95) | {"goodput_rate": 9.0}), "not json", None):
        done, job_pod = finished_job(job, message)
        later = T0 + timedelta(seconds=40)
        yield decide.decide(snap(enabled, wire(ready.status), [pod, job_pod], [done], now=later))
    asked = {RUN_PROBE_ANNOTATION: "now"}
    yield decide.decide(snap(enabled, wire(ready.status), [pod], annotations=asked, now=T0 + timedelta(hours=2)))
    statuses = [
        container_status(c["name"], False, 2, "CrashLoopBackOff", "preflight failed") for c in pod["spec"]["containers"]
    ]
    yield decide.decide(snap(enabled, wire(ready.status), [running_pod(pod, statuses=statuses)]))
    yield decide.decide(snap({**enabled, "image": "ghcr.io/pd-serving/pd-runtime:0.2.0"}, wire(ready.status), [pod]))
    unscheduled = running_pod(pod, ready=False)
    unscheduled["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": "Insufficient"}]
    yield decide.decide(snap(enabled, wire(ready.status), [unscheduled]))
    yield decide.decide(snap({**enabled, "prefill": {"gpus": "9-0"}}, wire(ready.status), [pod]))


def written(spec: Obj) -> Iterator[tuple[str, Obj, bool]]:
    """(what, status or status patch, whether it is the full status) for every decision of a life."""
    for i, decision in enumerate(life(spec)):
        yield f"decision {i} status", wire(decision.status), True
        yield f"decision {i} patch", decision.patch, False


def children(spec: Obj) -> list[Obj]:
    lay = layout.build(layout.Owner("demo", "ns1", "uid-1", 3), validate_spec(spec))
    return [*render.children(lay).all, render.probe_job(lay, "demo-goodput-1")]


# ---- the tests ------------------------------------------------------------------------------------------


def test_the_variants_cover_every_example_and_the_optional_parts() -> None:
    assert {name.rsplit("-", 1)[0] for name, _ in VARIANTS} == {p.stem for p in EXAMPLES}
    assert len(VARIANTS) >= 4 * len(EXAMPLES)


@pytest.mark.parametrize(("name", "spec"), VARIANTS, ids=[n for n, _ in VARIANTS])
def test_every_status_key_is_in_the_crd_schema(name: str, spec: Obj) -> None:
    schema = status_schema()
    for what, status, full in written(spec):
        assert unknown_in_schema(status, schema, full=full) == [], f"{name}, {what}"


@pytest.mark.parametrize(("name", "spec"), VARIANTS, ids=[n for n, _ in VARIANTS])
def test_every_child_key_is_known_to_kubernetes(name: str, spec: Obj) -> None:
    for obj in children(spec):
        assert unknown_in_model(obj, MODELS[obj["kind"]].__name__, obj["kind"]) == [], name


def test_the_walks_reach_the_router_and_its_status() -> None:
    """status.router and RouterReady are walked (they are written only with spec.router.enabled)."""
    routed = [spec for _, spec in VARIANTS if spec.get("router", {}).get("enabled")]
    assert routed
    statuses = [status for _, status, full in written(routed[0]) if full]
    assert all(s["router"]["ready"] == "1/2" for s in statuses)
    assert all("RouterReady" in [c["type"] for c in s["conditions"]] for s in statuses)
    assert {"Deployment", "ServiceAccount", "Role", "RoleBinding"} <= {o["kind"] for o in children(routed[0])}


def test_the_walks_catch_a_misspelt_key() -> None:
    """The checks themselves can fail: one wrong key in a status and in a pod."""
    status = wire(decide.decide(snap(VARIANTS[0][1], {})).status)
    status["roles"][0]["restartcount"] = 1
    status["podIp"] = "10.0.0.1"
    assert unknown_in_schema(status, status_schema()) == [
        "status.podIp (not in the schema)",
        "status.roles[0].restartcount (not in the schema)",
    ]
    pod = children(VARIANTS[0][1])[-2]
    pod["spec"]["containers"][0]["readinessProbe"]["httpget"] = {}
    assert unknown_in_model(pod, "V1Pod", "Pod") == ["Pod.spec.containers[0].readinessProbe.httpget"]


def test_applied_children_are_the_rendered_ones() -> None:
    decision = decide.decide(snap(VARIANTS[0][1], {}))
    applied = [a.obj["kind"] for a in decision.actions if isinstance(a, Apply)]
    assert applied == ["Service", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"]
