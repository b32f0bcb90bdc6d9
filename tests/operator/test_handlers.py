"""The shell: reconcile() executes the core's actions over HTTP against kmock's Kubernetes emulator.

The decisions themselves are tested without I/O in test_decide.py; here only what the shell adds: it
asks the proxy when the core wants it, runs the actions in order, and decides again after a failure.
kmock does not implement server-side apply's create, so the applied children are checked as requests;
the e2e suite applies them against a real API server.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Resource
from kopf._core.actions.invocation import invoke
from kopf._core.engines import indexing
from kopf._core.intents.causes import ChangingCause, Reason
from kubernetes import client

from pd_operator import api, autotune, decide, handlers, layout, render
from pd_operator import snapshot as snapshot_module
from pd_operator.actions import CreateSecret, Decision
from pd_operator.api import AutotuneTrial, PDDeploymentSpec
from pd_operator.handlers import Deps, reconcile
from pd_operator.kube import APPLY_PATCH, STRATEGIC_MERGE_PATCH, Kube, KubeError
from pd_operator.observe import ProxyReport
from pd_operator.refusals import ApiFailure
from pd_operator.settings import Settings
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import validate_spec
from pd_operator.views import pod_view
from tests.operator import test_dra
from tests.operator.podfacts import proxy_status, running_pod

NS, NAME, UID = "ns1", "demo", "uid-1"
SPEC: dict[str, Any] = {"model": "m", "engine": "simulated", "goodputProbe": {"enabled": True}}
T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


@pytest.fixture
def kube(kmock: Any) -> Kube:
    return Kube(client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/"))))


@pytest.fixture
def world(kube: Kube) -> tuple[Deps, list[str]]:
    polled: list[str] = []

    async def proxy(url: str, admin_key: str | None) -> ProxyReport:
        polled.append(url)
        return ProxyReport(status=proxy_status())

    return Deps(kube=kube, fetch_proxy_status=proxy, now=lambda: T0), polled


def snapshot(pods: list[dict[str, Any]] | None = None, repair: bool = True) -> Snapshot:
    deployment = Deployment(NAME, NS, UID, 1, SPEC)
    return Snapshot(deployment, T0, pods=[pod_view(p) for p in pods or []], repair_children=repair)


async def test_first_pass_applies_children_and_creates_the_pod(world: Any, kube: Kube, kmock: Any) -> None:
    deps, _ = world
    decision = await reconcile(snapshot(), deps)
    applied = [r for r in kmock if r.method == "PATCH"]
    assert [r.headers["Content-Type"] for r in applied] == [APPLY_PATCH] * 4  # Service, NetworkPolicy, PDB, ConfigMap
    pod = await kube.get("Pod", NS, NAME)
    assert pod is not None and pod["metadata"]["ownerReferences"][0]["uid"] == UID
    assert decision.status.phase == "Pending"


async def test_the_credentials_secret_is_created_once_with_random_keys_and_never_replaced(
    world: Any, kube: Kube, kmock: Any
) -> None:
    deps, _ = world
    await reconcile(snapshot(), deps)
    secret = await kube.get("Secret", NS, f"{NAME}-credentials")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["uid"] == UID
    keys = secret["stringData"]
    assert set(keys) == set(render.CREDENTIAL_KEYS) and all(len(v) >= 43 for v in keys.values())
    await reconcile(snapshot(), deps)  # a drift repair: the Secret read, seen to be ours, left alone
    assert await kube.get("Secret", NS, f"{NAME}-credentials") == secret
    assert not [r for r in kmock if r.method == "PATCH" and "/secrets/" in str(r.url)], "never applied"
    assert len([r for r in kmock if r.method == "POST" and str(r.url).endswith("/secrets")]) == 1, "created once"


def test_every_secret_gets_keys_of_its_own() -> None:
    action = CreateSecret({"kind": "Secret", "metadata": {"name": "x"}}, ("a", "b"))
    drawn = [handlers.with_drawn_keys(action)["stringData"] for _ in range(2)]
    assert len({*drawn[0].values(), *drawn[1].values()}) == 4


async def test_ready_pod_is_polled_and_gets_a_probe_job(world: Any, kube: Kube) -> None:
    deps, polled = world
    pod = running_pod(render.pod(layout.build(layout.Owner(NAME, NS, UID, 1), validate_spec(SPEC))))
    await kube.create(pod)
    decision = await reconcile(snapshot([pod], repair=False), deps)
    assert polled == ["http://10.1.2.3:8001/status"] and decision.status.phase == "Ready"
    assert decision.status.probe.job_name is not None
    assert await kube.get("Job", NS, decision.status.probe.job_name) is not None


async def test_the_proxies_status_is_read_with_the_admin_key_of_the_secret_read_once(kube: Kube, kmock: Any) -> None:
    sent: list[str | None] = []

    async def proxy(url: str, admin_key: str | None) -> ProxyReport:
        sent.append(admin_key)
        return ProxyReport(status=proxy_status())

    owner = layout.Owner(NAME, NS, UID, 1)
    pod = running_pod(render.pod(layout.build(owner, validate_spec(SPEC))))
    await kube.create(pod)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{NAME}-credentials", "namespace": NS}}
    await kube.create({**secret, "data": {"admin-key": base64.b64encode(b"the-admin-key").decode()}})
    deps, keys = Deps(kube=kube, fetch_proxy_status=proxy, now=lambda: T0), {}
    for _ in range(2):
        await reconcile(snapshot([pod], repair=False), deps, keys=keys)
    assert sent == ["the-admin-key"] * 2
    assert len([r for r in kmock if r.method == "GET" and "/secrets/" in str(r.url)]) == 1


async def test_api_errors_become_status_not_exceptions(world: Any) -> None:
    deps, _ = world
    broken = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    decision = await reconcile(snapshot(), Deps(kube=broken, fetch_proxy_status=deps.fetch_proxy_status))
    assert decision.status.phase == "Pending" and "cannot create the serving pod" in decision.status.message
    assert "CreatedPod" not in {e.reason for e in decision.events}


async def test_autotune_plans_once_per_reconcile_off_the_event_loop(world: Any, monkeypatch: Any) -> None:
    """The plan (0.3-0.7 s of CPU) runs in a worker thread, and once though the failed action decides twice."""
    threads: list[int] = []

    def recording(spec: PDDeploymentSpec) -> list[AutotuneTrial]:
        threads.append(threading.get_ident())
        return planner(spec)

    planner = autotune.plan_trials
    monkeypatch.setattr(autotune, "plan_trials", recording)
    deps, _ = world
    broken = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    spec = {**SPEC, "model": "Qwen/Qwen3-235B-A22B-FP8", "autotune": {"enabled": True}}
    snap = Snapshot(Deployment(NAME, NS, UID, 1, spec), T0)
    decision = await reconcile(snap, Deps(kube=broken, fetch_proxy_status=deps.fetch_proxy_status))
    assert "cannot create the serving pod" in decision.status.message  # decided twice
    assert decision.status.autotune is not None and decision.status.autotune.trials
    assert len(threads) == 1 and threads[0] != threading.get_ident()


async def test_one_reconcile_validates_the_spec_once_and_builds_the_layout_once_per_decide(
    world: Any, monkeypatch: Any
) -> None:
    calls: list[str] = []

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def count(*args: Any) -> Any:
            calls.append(name)
            return real(*args)

        return count

    for module, name in [(snapshot_module, "validate_spec"), (decide, "decide"), (layout, "build")]:
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    deps, _ = world
    broken = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    decision = await reconcile(snapshot(), Deps(kube=broken, fetch_proxy_status=deps.fetch_proxy_status))
    assert "cannot create the serving pod" in decision.status.message  # decided again after the failures
    # once more, before deciding, for the names of the children the shell reads
    assert sorted(calls) == ["build", "build", "build", "decide", "decide", "validate_spec"]


class ClaimServer:
    """Answers the DRA reads once all of them were asked (never, were they read one after another); one
    claim's read is refused."""

    def __init__(self, claims: int, refused: str) -> None:
        self.claims, self.refused, self.asked = claims, refused, 0
        self.all_asked = asyncio.Event()

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked += 1
        if self.asked == self.claims:
            self.all_asked.set()
        await asyncio.wait_for(self.all_asked.wait(), timeout=30)
        if name == self.refused:
            raise KubeError(ApiFailure(403, "Forbidden", "resourceclaims is forbidden"))
        return {"metadata": {"name": name}, "status": {}}

    async def items(self, kind: str, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        return [{"metadata": {"name": "demo-gpus-a", "uid": "u"}}]


async def test_dra_claims_are_read_at_once_and_a_refused_one_leaves_only_itself_out() -> None:
    pods = []
    for i in range(3):
        pod = copy.deepcopy(test_dra._pod())
        pod["metadata"]["name"] = f"{NAME}-{i}"
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"claim-{i}"}]
        pods.append(pod)
    server = ClaimServer(claims=3, refused="claim-1")
    snap = await handlers.read_claims(server, test_dra._snap(pods))  # type: ignore[arg-type]
    assert sorted(snap.claims) == ["claim-0", "claim-2"] and [t.name for t in snap.claim_templates] == ["demo-gpus-a"]


async def test_proxy_poll_failure_is_a_report(unused_tcp_port: int) -> None:
    report = await handlers.fetch_proxy_status(f"http://127.0.0.1:{unused_tcp_port}/status", None)
    assert report.status is None and report.error


async def _indexed(registry: kopf.OperatorRegistry, objects: list[tuple[Resource, dict[str, Any]]]) -> Any:
    """The indexes as kopf's own indexing fills them from watch events, through the registered functions."""
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    for resource, obj in objects:
        await indexing.index_resource(
            indexers=indexers,
            registry=registry,
            settings=kopf.OperatorSettings(),
            resource=resource,
            raw_event={"type": "ADDED", "object": obj},  # type: ignore[typeddict-item]
            memory=indexing.IndexingMemory(),
            logger=logging.getLogger(__name__),
            memo=kopf.Memo(),
            body=kopf.Body(obj),
        )
    return indexers.indices


async def test_kopf_passes_each_handler_what_it_names(monkeypatch: Any) -> None:
    """kopf's own indexing and invocation (no hand-made keywords): the pod and its node a watch indexed
    reach the snapshot, the decision's status reaches kopf's patch, its Events kopf.event."""
    reg = handlers.registry(Settings())
    pod = running_pod(render.pod(layout.build(layout.Owner(NAME, NS, UID, 1), validate_spec(SPEC))))
    node = {"metadata": {"name": "mi300x-0"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    indices = await _indexed(reg, [(Resource("", "v1", "pods"), pod), (Resource("", "v1", "nodes"), node)])
    snapshots: list[Snapshot] = []

    async def deciding(
        snap: Snapshot, deps: Deps, known: dict[str, str] | None = None, keys: dict[str, str] | None = None
    ) -> Decision:
        snapshots.append(snap)
        return decide.decide(snap)

    events: list[str] = []
    monkeypatch.setattr(handlers, "reconcile", deciding)
    monkeypatch.setattr(kopf, "event", lambda body, *, type, reason, message: events.append(reason))
    operator = handlers.Operator(Settings(), deps=Deps(kube=None, fetch_proxy_status=None))  # type: ignore[arg-type]
    metadata = {"name": NAME, "namespace": NS, "uid": UID, "generation": 1}
    body = kopf.Body({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": SPEC})
    cause = ChangingCause(
        logger=logging.getLogger(__name__),
        indices=indices,
        memo=kopf.Memo(operator=operator),
        resource=Resource(api.GROUP, api.VERSION, api.PLURAL),
        patch=kopf.Patch(),
        body=body,
        initial=True,
        reason=Reason.CREATE,
    )
    await invoke(handlers.on_change, kwargsrc=cause)
    (snap,) = snapshots
    assert [p.name for p in snap.pods] == [NAME] and list(snap.nodes) == ["mi300x-0"]
    assert snap.repair_children and cause.patch["status"]["phase"] == decide.decide(snap).status.phase
    assert events == [e.reason for e in decide.decide(snap).events]
    await invoke(handlers.on_delete, kwargsrc=dataclasses.replace(cause, reason=Reason.DELETE))


def test_the_registry_logs_in_and_has_one_timer_at_the_configured_interval() -> None:
    """A registry of our own gets none of kopf's default handlers: without a login one, kopf cannot connect."""
    reg = handlers.registry(Settings(resync_seconds=7.5))
    timers = [h for h in reg._spawning.get_all_handlers() if h.id == "resync"]
    assert [t.interval for t in timers] == [7.5]
    activities = {h.id: h.activity.value for h in reg._activities.get_all_handlers()}
    assert activities == {"login_via_client": "authentication", "configure": "startup"}


async def test_an_orphan_is_adopted_by_a_patch_naming_its_uid_after_the_pddeployment_is_read_again(
    world: Any, kube: Kube, kmock: Any
) -> None:
    deps, _ = world
    pod = running_pod(render.pod(layout.build(layout.Owner(NAME, NS, UID, 1), validate_spec(SPEC))))
    pod["metadata"]["ownerReferences"] = []
    await kube.create(pod)
    meta = {"name": NAME, "namespace": NS, "uid": UID}  # kmock gives no uids: the API server's would be this
    await kube.create({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta})
    deployment = Deployment(NAME, NS, UID, 1, SPEC)
    decision = await reconcile(Snapshot(deployment, T0, pods=[pod_view(pod)], repair_children=False), deps)
    reads_then_adopts = list(kmock)[2:4]  # after the two creates above
    assert [(r.method, r.url.path) for r in reads_then_adopts] == [
        ("GET", f"/apis/{api.API_VERSION}/namespaces/{NS}/pddeployments/{NAME}"),
        ("PATCH", f"/api/v1/namespaces/{NS}/pods/{NAME}"),
    ]
    patch = reads_then_adopts[1]
    assert patch.headers["Content-Type"] == STRATEGIC_MERGE_PATCH and patch.data["metadata"]["uid"] == "pod-uid-1"
    adopted = await kube.get("Pod", NS, NAME)
    assert adopted is not None and adopted["metadata"]["ownerReferences"][0]["uid"] == deployment.uid
    assert "AdoptedPod" in {e.reason for e in decision.events}
