"""Replicas: one serving pod each, rolled at most rollout.maxUnavailable at a time, summarised in status."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator import decide, layout, render
from pd_operator.actions import Create, Decision, Delete
from pd_operator.observe import ProxyReport, wire
from pd_operator.serving_pods import PodAction, rollout
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import validate_spec
from pd_operator.views import pod_view
from tests.operator.podfacts import proxy_status, running_pod
from tests.operator.test_decide import T0, merged

NS, NAME, UID = "ns1", "demo", "uid-1"
SPEC: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 3}
OWNER = layout.Owner(NAME, NS, UID, 1)
NAMES = [NAME, f"{NAME}-1", f"{NAME}-2"]


def lay(spec: dict[str, Any]) -> layout.Layout:
    return layout.build(OWNER, validate_spec(spec))


def pods_of(spec: dict[str, Any], ready: bool = True, count: int = 3) -> list[dict[str, Any]]:
    """Running replicas of ``spec``, each with its own IP and UID."""
    rendered = render.children(lay({**spec, "replicas": count})).pods
    return [running_pod(p, ready=ready, ip=f"10.1.2.{i + 3}", uid=f"pod-uid-{i}") for i, p in enumerate(rendered)]


def snapshot(
    spec: dict[str, Any], pods: list[dict[str, Any]], status: dict[str, Any] | None = None, **kw: Any
) -> Snapshot:
    deployment = Deployment(NAME, NS, UID, 1, spec, status or {}, {})
    return Snapshot(deployment, T0, pods=[pod_view(p) for p in pods], repair_children=False, **kw)


def verified(pods: list[dict[str, Any]]) -> dict[str, ProxyReport]:
    return {p["metadata"]["name"]: ProxyReport(status=proxy_status()) for p in pods}


def deleted(decision: Decision) -> list[str]:
    return [a.name for a in decision.actions if isinstance(a, Delete)]


def serving_status(spec: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The stored status once every pod below has verified a KV transfer."""
    decision = decide.decide(snapshot(spec, pods, proxies=verified(pods)))
    out: dict[str, Any] = merged({}, decision.patch)
    return out


# ---- rendering ------------------------------------------------------------------------------------------


def test_each_replica_is_the_whole_layout_under_its_own_name() -> None:
    children = render.children(lay(SPEC))
    assert [p["metadata"]["name"] for p in children.pods] == NAMES
    hashes = {p["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH] for p in children.pods}
    assert len(hashes) == 1 and all(p["spec"] == children.pods[0]["spec"] for p in children.pods)
    assert render.children(lay({**SPEC, "replicas": 1})).pods[0]["metadata"]["name"] == NAME


@pytest.mark.parametrize(("replicas", "max_unavailable", "min_available"), [(1, 1, 0), (3, 1, 2), (3, 2, 1), (2, 5, 0)])
def test_disruption_budget_keeps_replicas_minus_max_unavailable(
    replicas: int, max_unavailable: int, min_available: int
) -> None:
    spec = {**SPEC, "replicas": replicas, "rollout": {"maxUnavailable": max_unavailable}}
    pdb = next(o for o in render.children(lay(spec)).applied if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == min_available
    assert pdb["spec"]["selector"]["matchLabels"] == render.serving_selector(OWNER)


# ---- the rollout policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verbs", "available", "max_unavailable", "expected"),
    [
        # one replica: recreate, whatever its state
        (["roll"], [True], 1, ["roll"]),
        (["roll"], [False], 1, ["roll"]),
        # all serving: the highest index goes first, the others hold
        (["roll", "roll", "roll"], [True] * 3, 1, ["hold", "hold", "roll"]),
        (["roll", "roll", "roll"], [True] * 3, 2, ["hold", "roll", "roll"]),
        # a replacement still starting (or not yet verified) uses up the budget
        (["roll", "roll", "keep"], [True, True, False], 1, ["hold", "hold", "keep"]),
        (["roll", "roll", "wait"], [True, True, False], 1, ["hold", "hold", "wait"]),
        (["roll", "roll", "create"], [True, True, False], 1, ["hold", "hold", "create"]),
        # the replacement serves: the next one rolls
        (["roll", "roll", "keep"], [True, True, True], 1, ["hold", "roll", "keep"]),
        # an outdated replica that serves nothing rolls at once and does not protect the others
        (["roll", "roll", "roll"], [True, False, True], 1, ["hold", "roll", "hold"]),
        (["roll", "roll", "roll"], [False, False, False], 1, ["roll", "roll", "roll"]),
        # a crashed pod is replaced regardless
        (["replace", "roll", "roll"], [False, True, True], 1, ["replace", "hold", "hold"]),
        # nothing outdated: nothing changes
        (["keep", "keep", "create"], [True, True, False], 1, ["keep", "keep", "create"]),
    ],
)
def test_rollout_keeps_at_most_max_unavailable_replicas_out(
    verbs: list[PodAction], available: list[bool], max_unavailable: int, expected: list[str]
) -> None:
    assert rollout(verbs, available, max_unavailable) == expected


# ---- decisions ------------------------------------------------------------------------------------------


def test_three_replicas_create_three_pods() -> None:
    decision = decide.decide(snapshot(SPEC, []))
    assert [a.obj["metadata"]["name"] for a in decision.actions if isinstance(a, Create)] == NAMES
    assert decision.status.ready == "0/3" and decision.status.replicas == 3
    assert decision.status.selector == "app.kubernetes.io/component=serving,pd.serving.dev/deployment=demo"


def test_a_spec_change_rolls_one_replica_at_a_time_waiting_for_ready_and_verified() -> None:
    pods = pods_of(SPEC)
    status = serving_status(SPEC, pods)
    assert status["readyReplicas"] == 3 and status["availableReplicas"] == 3 and status["phase"] == "Ready"
    changed = {**SPEC, "image": "ghcr.io/pd-serving/pd-runtime:0.2.0"}
    first = decide.decide(snapshot(changed, pods, status))
    assert deleted(first) == [f"{NAME}-2"]
    assert [r.phase for r in first.status.replica_statuses] == ["Progressing"] * 3
    status = merged(status, first.patch)
    # NAME-2 terminates, then its replacement starts: nobody else rolls meanwhile
    pods[2]["metadata"]["deletionTimestamp"] = "2026-11-29T08:00:00Z"
    assert deleted(decide.decide(snapshot(changed, pods, status))) == []
    new = pods_of(changed)[2]
    new["metadata"]["uid"] = "pod-uid-new"
    starting = [*pods[:2], running_pod(new, ready=False, uid="pod-uid-new")]
    assert deleted(decide.decide(snapshot(changed, starting, status))) == []
    # ready but its KV transfer not yet verified: still waiting
    ready = [*pods[:2], new]
    unverified = decide.decide(
        snapshot(
            changed, ready, status, proxies={new["metadata"]["name"]: ProxyReport(status=proxy_status(transfer=False))}
        )
    )
    assert deleted(unverified) == []
    # verified: the next replica rolls
    verified_now = decide.decide(
        snapshot(changed, ready, status, proxies={new["metadata"]["name"]: ProxyReport(status=proxy_status())})
    )
    assert deleted(verified_now) == [f"{NAME}-1"]
    assert verified_now.status.updated_replicas == 1


def test_one_replica_is_recreated_even_while_it_serves() -> None:
    spec = {**SPEC, "replicas": 1}
    pods = pods_of(spec, count=1)
    status = serving_status(spec, pods)
    changed = {**spec, "image": "ghcr.io/pd-serving/pd-runtime:0.2.0"}
    assert deleted(decide.decide(snapshot(changed, pods, status))) == [NAME]


def test_scaling_down_deletes_the_surplus_pods() -> None:
    pods = pods_of(SPEC)
    status = serving_status(SPEC, pods)
    down = decide.decide(snapshot({**SPEC, "replicas": 1}, pods, status))
    assert deleted(down) == [f"{NAME}-1", f"{NAME}-2"]
    assert {e.reason for e in down.events} >= {"ScalingDown"}
    assert down.status.replicas == 3 and down.status.ready == "1/1" and down.status.phase == "Progressing"
    gone = decide.decide(snapshot({**SPEC, "replicas": 1}, pods[:1], merged(status, down.patch)))
    assert gone.status.replicas == 1 and gone.status.phase == "Ready" and deleted(gone) == []


def test_status_summarises_the_replicas() -> None:
    pods = pods_of(SPEC)
    pods[1] = pods_of(SPEC, ready=False)[1]
    decision = decide.decide(snapshot(SPEC, pods, proxies=verified(pods)))
    st = decision.status
    assert (st.ready, st.containers_ready, st.ready_replicas, st.available_replicas) == ("2/3", "6/9", 2, 2)
    assert st.phase == "Progressing" and st.message.startswith("2/3 replicas ready; demo-1: waiting for prefill")
    assert [(r.pod_name, r.phase, r.ready, r.node_name) for r in st.replica_statuses] == [
        (NAME, "Ready", "3/3", "mi300x-0"),
        (f"{NAME}-1", "Progressing", "0/3", "mi300x-0"),
        (f"{NAME}-2", "Ready", "3/3", "mi300x-0"),
    ]
    prefill = next(c for c in st.conditions if c.type == "PrefillReady")
    assert prefill.status == "False" and prefill.message.startswith("2/3 replicas: demo-1: not ready: prefill")
    kv = next(c for c in st.conditions if c.type == "KVTransferVerified")
    assert kv.status == "True" and kv.message == "on all 3 replicas"
    assert "replicaStatuses" in wire(st)


def test_without_the_canary_each_replicas_proxy_is_read_until_it_verified_a_transfer() -> None:
    spec = {**SPEC, "proxy": {"canaryIntervalSeconds": 0}}
    pods = pods_of(spec)
    assert decide.proxy_urls(snapshot(spec, pods)) == {
        NAME: "http://10.1.2.3:8001/status",
        f"{NAME}-1": "http://10.1.2.4:8001/status",
        f"{NAME}-2": "http://10.1.2.5:8001/status",
    }
    only_first = decide.decide(snapshot(spec, pods, proxies=verified(pods[:1])))
    status = merged({}, only_first.patch)
    assert list(decide.proxy_urls(snapshot(spec, pods, status))) == [f"{NAME}-1", f"{NAME}-2"]
    assert list(decide.proxy_urls(snapshot(SPEC, pods, status))) == NAMES  # with the canary: every replica
    kv = next(c for c in only_first.status.conditions if c.type == "KVTransferVerified")
    assert kv.status == "False" and kv.message.startswith("1/3 replicas: demo-1: the proxy is not running yet")
