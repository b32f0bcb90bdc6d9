"""status.router and RouterReady: the router Deployment's ready pods in the PDDeployment's status, its
Events on the way down and back up, nothing of it without a router; the shell reads the Deployment only
when the router is enabled, and a failed read is Unknown."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from pd_operator import decide, handlers, metrics
from pd_operator.actions import Decision
from pd_operator.api import Condition
from pd_operator.handlers import Deps
from pd_operator.kube import Kube, KubeError
from pd_operator.observe import RouterRead, find, wire
from pd_operator.refusals import ApiFailure
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.views import DeploymentView, deployment_view
from tests.operator.test_decide import T0

NS, NAME, UID = "ns1", "demo", "uid-1"
ROUTED: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2, "router": {"enabled": True}}
PLAIN: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2}


def ready(pods: int, generation: int = 1, observed: int = 1) -> RouterRead:
    return RouterRead(DeploymentView("demo-router", generation, observed, pods))


def decided(spec: dict[str, Any], router: RouterRead | None, stored: dict[str, Any] | None = None) -> Decision:
    deployment = Deployment(NAME, NS, UID, 1, spec, stored or {}, {})
    return decide.decide(Snapshot(deployment, T0, repair_children=False, router=router))


def router_ready(decision: Decision) -> Condition | None:
    return find(decision.status.conditions, "RouterReady")


def test_without_a_router_no_read_no_status_and_no_condition() -> None:
    assert decide.router_read(Snapshot(Deployment(NAME, NS, UID, 1, PLAIN), T0)) is None
    decision = decided(PLAIN, None)
    assert decision.status.router is None and router_ready(decision) is None
    assert "router" not in wire(decision.status)


def test_the_router_deployment_is_read_only_for_a_valid_spec_with_the_router_enabled() -> None:
    assert decide.router_read(Snapshot(Deployment(NAME, NS, UID, 1, ROUTED), T0)) == "demo-router"
    invalid = {**ROUTED, "replicas": -1}
    assert decide.router_read(Snapshot(Deployment(NAME, NS, UID, 1, invalid), T0)) is None


def test_every_router_pod_ready_is_true_with_the_counts() -> None:
    decision = decided(ROUTED, ready(2))
    assert wire(decision.status)["router"] == {"replicas": 2, "readyReplicas": 2, "ready": "2/2"}
    cond = router_ready(decision)
    assert cond is not None
    assert (cond.status, cond.reason, cond.message) == ("True", "RouterAvailable", "2/2 router pods ready")


def test_one_ready_router_pod_is_enough_to_answer() -> None:
    cond = router_ready(decided(ROUTED, ready(1)))
    assert cond is not None and (cond.status, cond.message) == ("True", "1/2 router pods ready")


def test_no_ready_router_pod_is_false_and_says_who_gets_no_answer() -> None:
    decision = decided(ROUTED, ready(0))
    assert decision.status.router is not None and decision.status.router.ready == "0/2"
    cond = router_ready(decision)
    assert cond is not None and (cond.status, cond.reason) == ("False", "NoRouterPodReady")
    assert cond.message == "0/2 router pods ready: clients of demo-router get no answer"


def test_counts_the_controller_has_not_caught_up_with_say_so() -> None:
    cond = router_ready(decided(ROUTED, ready(2, generation=3, observed=2)))
    assert cond is not None and cond.status == "True"
    assert cond.message == "2/2 router pods ready (its controller has not seen generation 3 of demo-router yet)"


def test_a_missing_deployment_is_unknown_with_no_ready_pod() -> None:
    decision = decided(ROUTED, RouterRead())
    cond = router_ready(decision)
    assert cond is not None and (cond.status, cond.reason) == ("Unknown", "RouterNotFound")
    assert decision.status.router is not None and decision.status.router.ready == "0/2"


def test_a_failed_read_is_unknown_and_keeps_the_counts_last_read() -> None:
    before = wire(decided(ROUTED, ready(2)).status)
    decision = decided(ROUTED, RouterRead(failed=True), before)
    cond = router_ready(decision)
    assert cond is not None and (cond.status, cond.reason) == ("Unknown", "RouterUnreadable")
    assert "demo-router could not be read" in cond.message
    assert wire(decision.status)["router"] == before["router"]
    assert decided(ROUTED, RouterRead(failed=True)).status.router is None  # never read: no counts to show


def test_events_when_it_goes_down_and_comes_back_and_none_while_it_stays() -> None:
    starting = decided(ROUTED, RouterRead())
    assert not [e for e in starting.events if e.reason.startswith("Router")]  # Unknown: no news

    def events(stored: Decision, router: RouterRead) -> tuple[Decision, list[tuple[str, str, str]]]:
        now = decided(ROUTED, router, wire(stored.status))
        return now, [(e.type, e.reason, e.message) for e in now.events if e.reason.startswith("Router")]

    down, seen = events(starting, ready(0))
    assert seen == [("Warning", "RouterNotReady", "0/2 router pods ready: clients of demo-router get no answer")]
    up, seen = events(down, ready(2))
    assert seen == [("Normal", "RouterReady", "2/2 router pods ready")]
    steady, seen = events(up, ready(2))
    assert seen == [] and steady.patch == {}
    _, seen = events(steady, ready(1))
    assert seen == []  # still True: one pod answers
    _, seen = events(steady, ready(0))
    assert seen == [("Warning", "RouterNotReady", "0/2 router pods ready: clients of demo-router get no answer")]


def test_disabling_the_router_removes_its_status_and_condition() -> None:
    stored = wire(decided(ROUTED, ready(2)).status)
    decision = decided(PLAIN, None, stored)
    assert decision.patch["router"] is None  # the merge patch deletes the key
    assert "RouterReady" not in [c["type"] for c in decision.patch["conditions"]]
    assert decision.status.router is None and router_ready(decision) is None


def test_deployment_view_reads_the_controllers_counts() -> None:
    obj = {
        "metadata": {"name": "demo-router", "generation": 4},
        "status": {"observedGeneration": 3, "readyReplicas": 1},
    }
    assert deployment_view(obj) == DeploymentView("demo-router", 4, 3, 1)
    assert deployment_view({"metadata": {"name": "demo-router", "generation": 1}, "status": {}}).ready_replicas == 0
    assert not deployment_view(obj).observed


# ---- the shell --------------------------------------------------------------------------------------------


class Deployments:
    """Answers GETs of Deployments (``found``), refusing them with ``refused``; records what was asked."""

    def __init__(self, found: dict[str, Any] | None = None, refused: bool = False) -> None:
        self.found, self.refused = found, refused
        self.asked: list[tuple[str, str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append((kind, namespace, name))
        if self.refused:
            raise KubeError(ApiFailure(403, "Forbidden", "deployments.apps is forbidden"))
        return self.found


def shell_snapshot(spec: dict[str, Any]) -> Snapshot:
    return Snapshot(Deployment(NAME, NS, UID, 1, spec), T0)


async def test_the_shell_reads_the_router_deployment_only_when_enabled() -> None:
    found = {
        "metadata": {"name": "demo-router", "generation": 1},
        "status": {"observedGeneration": 1, "readyReplicas": 2},
    }
    kube = Deployments(found)
    snap = await handlers.read_router(kube, shell_snapshot(PLAIN))  # type: ignore[arg-type]
    assert kube.asked == [] and snap.router is None
    snap = await handlers.read_router(kube, shell_snapshot(ROUTED))  # type: ignore[arg-type]
    assert kube.asked == [("Deployment", NS, "demo-router")]
    assert snap.router == RouterRead(DeploymentView("demo-router", 1, 1, 2))


async def test_the_shell_tells_a_missing_deployment_from_a_failed_read() -> None:
    missing = await handlers.read_router(Deployments(None), shell_snapshot(ROUTED))  # type: ignore[arg-type]
    assert missing.router == RouterRead()
    errors = metrics.RECONCILE_ERRORS.labels("Deployment")
    before = errors._value.get()
    failed = await handlers.read_router(Deployments(refused=True), shell_snapshot(ROUTED))  # type: ignore[arg-type]
    assert failed.router == RouterRead(failed=True)
    assert errors._value.get() == before + 1  # logged and counted, as every read the core asks for


@pytest.mark.parametrize(("spec", "reads"), [(PLAIN, 0), (ROUTED, 1)])
async def test_one_reconcile_reads_the_router_deployment_once_when_enabled(
    spec: dict[str, Any], reads: int, kmock: Any
) -> None:
    async def proxy(url: str, admin_key: str | None) -> Any:
        raise AssertionError(f"no proxy to read yet: {url}")

    kube = Kube(client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/"))))
    snap = Snapshot(Deployment(NAME, NS, UID, 1, spec), T0, repair_children=False)
    decision = await handlers.reconcile(snap, Deps(kube=kube, fetch_proxy_status=proxy, now=lambda: T0))
    gets = [r for r in kmock if r.method == "GET" and "/deployments/" in str(r.url)]
    assert len(gets) == reads
    assert (router_ready(decision) is not None) == bool(reads)
