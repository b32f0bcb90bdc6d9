"""spec.autoscaling through the core: what it reads, the Scale action, status and Events; and the shell's part."""

from __future__ import annotations

import dataclasses
from typing import Any

from prometheus_client import generate_latest

from pd_operator import autoscale, decide, handlers, metrics
from pd_operator.actions import Decision, Scale
from pd_operator.command_lines import engine_containers
from pd_operator.goodput import rfc3339
from pd_operator.observe import ProxyReport, find, parse
from pd_operator.refusals import ApiFailure
from pd_operator.validation import validate_spec
from tests.operator.podfacts import proxy_status
from tests.operator.test_autoscale import goodput_status
from tests.operator.test_decide import T0, merged
from tests.operator.test_replicas import NAME, NS, pods_of, snapshot
from tests.operator.test_written_keys import status_schema, unknown_in_schema

SPEC: dict[str, Any] = {
    "model": "m",
    "engine": "simulated",
    "replicas": 1,
    "autoscaling": {"enabled": True, "maxReplicas": 3, "scaleUpStabilizationSeconds": 0},
}
CAPACITY = 8.9


def _goodput(rate: float | None = CAPACITY) -> dict[str, Any]:
    return goodput_status(rate).model_dump(mode="json", by_alias=True, exclude_none=True)


def _report(rate: float) -> ProxyReport:
    demand = {
        "window_s": 30.0,
        "requests_per_second": rate,
        "arrivals": int(rate * 30),
        "in_flight": 5,
        "queued": 0,
        "output_tokens": {"requests": 10, "sum": 10_000},
        "prompt_tokens": {"requests": 10, "sum": 20_000},
    }
    return ProxyReport(status={**proxy_status(), "demand": demand})


def _decide(
    rate: float, stored: dict[str, Any] | None = None, replicas: int = 1, **kw: Any
) -> tuple[Decision, dict[str, Any]]:
    spec = {**SPEC, "replicas": replicas}
    pods = pods_of(spec, count=replicas)
    proxies = {p["metadata"]["name"]: _report(rate / replicas) for p in pods}
    status = stored if stored is not None else {"goodput": _goodput()}
    decision = decide.decide(snapshot(spec, pods, status, proxies=proxies, **kw))
    return decision, merged(status, decision.patch)


def test_every_ready_replica_proxy_is_read_for_its_demand() -> None:
    spec = {**SPEC, "replicas": 2}
    pods = pods_of(spec, count=2)
    _, stored = _decide(1.0, replicas=2)
    urls = decide.proxy_urls(snapshot(spec, pods, stored))
    assert sorted(urls) == [NAME, f"{NAME}-1"]
    assert decide.hpa_read(snapshot(spec, pods, stored))


def test_without_autoscaling_a_colocated_proxy_is_read_only_until_its_engines_releases_are_known() -> None:
    plain = {"model": "m", "engine": "simulated", "mode": "colocated"}
    [pod] = pods_of(plain, count=1)
    assert list(decide.proxy_urls(snapshot(plain, [pod]))) == [NAME]
    names = [c.name for c in engine_containers(validate_spec(plain))]
    known = {"index": 0, "podName": NAME, "podUid": pod["metadata"]["uid"], "phase": "Ready"}
    stored = {"replicaStatuses": [known | {"engineVersions": dict.fromkeys(names, "0.31.0")}]}
    assert decide.proxy_urls(snapshot(plain, [pod], stored)) == {}


def test_demand_past_capacity_scales_up_through_the_scale_subresource_with_an_event() -> None:
    decision, stored = _decide(20.0)
    assert [a for a in decision.actions if isinstance(a, Scale)] == [Scale(NAME, 3)]
    assert [(e.reason, e.message) for e in decision.events if e.reason == "ScaledUp"] == [
        ("ScaledUp", "demand 20 req/s > 0.8 x 1 x 8.9 req/s: replicas 1 -> 3")
    ]
    status = parse(stored)
    assert status.demand is not None and status.demand.requests_per_second == 20.0
    assert status.demand.mean_prompt_tokens == 2000.0 and status.demand.summary == "20/s"
    assert status.capacity is not None and status.capacity.summary == "8.9/s measured"
    assert status.autoscaling is not None and status.autoscaling.desired_replicas == 3
    assert status.autoscaling.last_scale_time == rfc3339(T0)
    active = find(status.conditions, "ScalingActive")
    assert active is not None and (active.status, active.reason) == ("True", "ScaledUp")
    assert unknown_in_schema(stored, status_schema()) == []


def test_demand_within_capacity_writes_nothing_more_once_steady() -> None:
    _, stored = _decide(3.0)
    decision, _ = _decide(3.0, stored)
    assert not [a for a in decision.actions if isinstance(a, Scale)]
    assert find(parse(stored).conditions, "ScalingActive").reason == "DemandWithinCapacity"  # type: ignore[union-attr]
    assert decision.patch == {}


def test_without_a_measured_capacity_it_says_so_and_scales_nothing() -> None:
    decision, stored = _decide(20.0, {"goodput": _goodput(None)})
    assert not [a for a in decision.actions if isinstance(a, Scale)]
    active = find(parse(stored).conditions, "ScalingActive")
    assert active is not None and (active.status, active.reason) == ("False", "NoCapacity")
    assert [e.reason for e in decision.events if e.type == "Warning"] == ["ScalingInactive"]


def test_a_horizontal_pod_autoscaler_on_the_object_owns_replicas() -> None:
    decision, stored = _decide(20.0, hpas=["web"])
    assert not [a for a in decision.actions if isinstance(a, Scale)]
    status = parse(stored)
    assert status.demand is not None and status.capacity is not None  # still published, for the HPA
    active = find(status.conditions, "ScalingActive")
    assert active is not None and active.reason == "ReplicasOwnedElsewhere"


def test_a_refused_scale_is_a_condition_not_a_scale_time() -> None:
    failure = ApiFailure(code=403, reason="Forbidden", message="cannot patch pddeployments/scale")
    decision, stored = _decide(20.0, failed={f"scale PDDeployment/{NAME}": failure})
    assert not [a for a in decision.actions if isinstance(a, Scale)]
    status = parse(stored)
    active = find(status.conditions, "ScalingActive")
    assert active is not None and (active.status, active.reason) == ("False", "ScaleFailed")
    assert status.autoscaling is not None and status.autoscaling.last_scale_time is None


def test_disabling_autoscaling_removes_its_status() -> None:
    _, stored = _decide(20.0)
    spec = {**SPEC, "autoscaling": {"enabled": False}}
    decision = decide.decide(snapshot(spec, pods_of(spec, count=1), stored))
    after = parse(merged(stored, decision.patch))
    assert after.demand is None and after.capacity is None and after.autoscaling is None
    assert find(after.conditions, "ScalingActive") is None


def test_only_autoscalers_that_target_this_pddeployment_count() -> None:
    def hpa(kind: str, name: str, api_version: str = "pd.serving.dev/v1alpha1") -> dict[str, Any]:
        ref = {"kind": kind, "name": name, "apiVersion": api_version}
        return {"metadata": {"name": f"{kind}-{name}"}, "spec": {"scaleTargetRef": ref}}

    assert handlers.targets(hpa("PDDeployment", NAME), NAME)
    assert not handlers.targets(hpa("PDDeployment", "other"), NAME)
    assert not handlers.targets(hpa("Deployment", NAME, "apps/v1"), NAME)
    assert not handlers.targets({"metadata": {"name": "x"}, "spec": {}}, NAME)


class ScaleServer:
    """What the shell asks of the API server for autoscaling: the namespace's HPAs, and the scale writes."""

    def __init__(self, hpas: list[dict[str, Any]]) -> None:
        self.hpas, self.scaled, self.listed = hpas, list[tuple[str, str, str, int]](), list[tuple[str, str]]()

    async def items(self, kind: str, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        self.listed.append((kind, namespace))
        return self.hpas

    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        self.scaled.append((kind, namespace, name, replicas))


async def test_the_shell_lists_autoscalers_and_writes_the_scale_subresource() -> None:
    ref = {"kind": "PDDeployment", "name": NAME, "apiVersion": "pd.serving.dev/v1alpha1"}
    server = ScaleServer([{"metadata": {"name": "web"}, "spec": {"scaleTargetRef": ref}}])
    pods = pods_of(SPEC, count=1)
    snap = await handlers.read_hpas(server, snapshot(SPEC, pods))  # type: ignore[arg-type]
    assert server.listed == [("HorizontalPodAutoscaler", NS)] and list(snap.hpas or []) == ["web"]
    failed = await handlers.execute(server, snap, (Scale(NAME, 3),))  # type: ignore[arg-type]
    assert failed == {} and server.scaled == [("PDDeployment", NS, NAME, 3)]
    off = {**SPEC, "autoscaling": {"enabled": False}}
    untouched = await handlers.read_hpas(server, snapshot(off, pods))  # type: ignore[arg-type]
    assert untouched.hpas is None and len(server.listed) == 1


def test_capacity_and_demand_are_operator_metrics_per_pddeployment() -> None:
    _, stored = _decide(20.0)
    metrics.set_scaling(NS, NAME, parse(stored))
    text = generate_latest().decode()
    for series, value in [
        ("pd_operator_capacity_requests_per_second", 8.9),
        ("pd_operator_demand_requests_per_second", 20.0),
        ("pd_operator_demand_in_flight", 5.0),
        ("pd_operator_desired_replicas", 3.0),
    ]:
        assert f'{series}{{name="{NAME}",namespace="{NS}"}} {value}' in text
    metrics.set_scaling(NS, NAME, parse({}))
    assert f'pd_operator_demand_requests_per_second{{name="{NAME}"' not in generate_latest().decode()
    metrics.set_scaling(NS, NAME, parse(stored))
    metrics.forget(NS, NAME)
    assert f'pd_operator_capacity_requests_per_second{{name="{NAME}"' not in generate_latest().decode()


MOVED = {**SPEC, "goodputProbe": {"enabled": True, "promptTokens": 200, "outputTokens": 1000}}  # proxies: 2000


def test_a_moved_workload_scales_the_measured_capacity_by_the_planner_and_says_so() -> None:
    pods = pods_of(MOVED, count=1)
    snap = snapshot(MOVED, pods, {"goodput": _goodput()}, proxies={NAME: _report(3.0)})
    asked = decide.prediction_queries(snap)
    assert asked is not None and [q.demand.prompt_tokens for q in asked if q] == [200, 2000]  # probe's, live
    assert autoscale.predictions(*asked) == autoscale.Predictions(None, None)  # model "m": no planner profile
    predicted = autoscale.Predictions(probe_workload=7.0, live_workload=3.5)
    decision = decide.decide(dataclasses.replace(snap, predictions=predicted))
    status = parse(merged({"goodput": _goodput()}, decision.patch))
    assert status.capacity is not None and (status.capacity.source, status.capacity.stale) == ("scaled", True)
    assert status.capacity.requests_per_second == round(3.5 * CAPACITY / 7.0, 3)
    assert status.capacity.summary == "4.45/s scaled (stale)"
    (event,) = [e for e in decision.events if e.reason.startswith("Capacity")]
    assert (event.reason, event.type) == ("CapacityScaled", "Normal")
    assert "moved to 2000/1000 tokens from the probe's 200/1000 tokens" in event.message
    again = decide.decide(
        snapshot(
            MOVED,
            pods,
            merged({"goodput": _goodput()}, decision.patch),
            proxies={NAME: _report(3.0)},
            predictions=predicted,
        )
    )
    assert not [e for e in again.events if e.reason.startswith("Capacity")]  # only when the basis changes
    assert unknown_in_schema(merged({"goodput": _goodput()}, decision.patch), status_schema()) == []


async def test_the_shell_asks_the_planner_off_the_event_loop() -> None:
    sim = {
        **MOVED,
        "model": "Qwen/Qwen3-235B-A22B-FP8",
        "simulation": {"profile": "qwen3-235b-mi300x", "timeScale": 10},
        "goodputProbe": {"enabled": True, "promptTokens": 200, "outputTokens": 20},
    }
    pods = pods_of(sim, count=1)
    snap = await handlers.predict(snapshot(sim, pods, proxies={NAME: _report(3.0)}))
    assert snap.predictions is not None and snap.predictions.probe_workload
    assert snap.predictions.live_workload and snap.predictions.live_workload < snap.predictions.probe_workload
    untouched = await handlers.predict(snapshot(SPEC, pods_of(SPEC, count=1)))  # no probe: no SLO to plan for
    assert untouched.predictions is None
