"""spec.autoscaling under a ramp across three real nodes: 1 -> 3 -> 1 replicas, no failed request.

The deployment is the simulated write pair at timeScale 0.5 (every modelled duration twice as long in
wall time) with 4 sequences per engine, so one replica's capacity is a few requests per second: the
load stays light for a small machine, and the modelled latencies (about a second to the first token)
dwarf what a loaded machine adds. The SLO is the seed's (TTFT 1 s, ITL 50 ms in model time), so 2 s and
100 ms in wall time. The capacity the operator scales on is **measured**: its own goodput probe searches
the highest rate one replica holds (`goodputProbe.search`), as a user would run it; the test reads that
figure from status.capacity and sets every load level relative to it, so whatever the search finds on a
busy machine, the levels mean the same: 0.3 C (one replica), 0.7 C (two at targetUtilization 0.6), 1.4 C
(three) and back to 0.3 C.

The client is an open-loop load generator (e2e/tests/load.py) spreading streamed completions over the
Service's ready endpoints; it judges every request against the SLO as `pdctl bench` does. The test
asserts: the replicas follow 1 -> 2 -> 3 -> 2 -> 1, each step after its stabilization window and
explained by an Event ("demand X req/s > 0.6 x N x C req/s: replicas N -> N+1"); no request fails (a
removed replica drains: its proxy keeps answering what reaches it until the Service has dropped it,
then finishes what it holds, and its engines' preStop hook holds their SIGTERM until the proxy is
gone); the attainment of the requests sent outside the start-up gaps (from a scale-up decision until
its replicas are available, plus the TTFT bound) reaches the SLO target;
`kubectl get pdd -o wide` and the operator's metrics show capacity and demand. No wall-clock
performance is asserted: every wait is bounded generously, and the latencies judged are the
simulation's (its time scale), not the machine's.

The timeline (replicas, demand, capacity, attainment) is written to the cluster's logs directory as
autoscaling-ramp.json, and to $PD_E2E_RAMP_TIMELINE when set: benchmarks/autoscaling_ramp_figure.py
draws docs/img/autoscaling-ramp.png from it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import ControlPlane
from e2e.stack import GPU_POOL, Stack, pool_placement
from e2e.tests.kube import (
    GROUP_PATH,
    Background,
    Obj,
    PodWatch,
    ReadyEndpoints,
    apply,
    create_namespace,
    pdd,
    pdd_events,
    pods,
    simulated_example,
    wait_for,
)
from e2e.tests.load import OpenLoop, Sent
from pd_runtime.bench.slo import Slo

log = logging.getLogger(__name__)
# The ramp runs about 6 minutes (the probe's search, four load levels, stabilization windows each way):
# the suite's default of 300 s would cut it short.
pytestmark = pytest.mark.timeout(1500)
POOL, NODES = GPU_POOL, 3  # the shared GPU pool, a third node for the ramp's time: one replica per node
NAME = "ramp"
SELECTOR = f"app.kubernetes.io/component=serving,pd.serving.dev/deployment={NAME}"
TIME_SCALE = 0.5
SLO = Slo(ttft_ms=1000 / TIME_SCALE, itl_ms=50 / TIME_SCALE, target=0.9)
PROMPT_TOKENS, OUTPUT_TOKENS = 200, 20
TARGET_UTILIZATION = 0.6
UP_WINDOW_S, DOWN_WINDOW_S = 10, 20
MODEL = "Qwen/Qwen3-235B-A22B-FP8"


@pytest.fixture(scope="module")
def nodes(stack: Stack, real_pool: Callable[[str, int], list[str]]) -> Iterator[list[str]]:
    """The pool's nodes; the third is removed afterwards, so the pool's other tests find the two they place on."""
    found = real_pool(POOL, NODES)
    yield found
    for node in found[2:]:
        stack.remove_real_node(node)


@pytest.fixture(scope="module")
def ns(operator: Stack, cp: ControlPlane, nodes: list[str]) -> Iterator[str]:
    name = create_namespace(cp, "t-ramp")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)
    # the pool is test_replicas.py's too: leave its nodes free (and the third node empty before it goes)
    wait_for(lambda: not pods(cp, name, SELECTOR), 120, "the ramp's serving pods gone")


def manifest() -> Obj:
    obj = simulated_example(NAME)
    spec = obj["spec"]
    spec["replicas"] = 1
    spec["node"] = pool_placement(POOL)
    spec["simulation"] = {"profile": "qwen3-235b-mi300x", "timeScale": TIME_SCALE, "reserveGpus": True}
    for role in ("prefill", "decode"):
        spec[role]["maxNumSeqs"] = 4  # a capacity of a few requests per second
    spec["proxy"]["canaryIntervalSeconds"] = 5  # a verified KV transfer soon after each pod starts
    spec["terminationGracePeriodSeconds"] = 20
    spec["goodputProbe"] = {
        "enabled": True,
        "search": True,
        "rate": 3,
        "requests": 30,
        "promptTokens": PROMPT_TOKENS,
        "outputTokens": OUTPUT_TOKENS,
        "slo": {"ttftMs": SLO.ttft_ms, "itlMs": SLO.itl_ms, "target": SLO.target},
        "intervalSeconds": 3600,  # one search, at Ready
    }
    spec["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetUtilization": TARGET_UTILIZATION,
        "scaleUpStabilizationSeconds": UP_WINDOW_S,
        "scaleDownStabilizationSeconds": DOWN_WINDOW_S,
    }
    return obj


def status(obj: Obj | None) -> Obj:
    found: Obj = (obj or {}).get("status") or {}
    return found


@dataclass
class Timeline(Background):
    """The PDDeployment sampled every second while the load runs, on the load generator's clock."""

    cp: ControlPlane
    ns: str
    load: OpenLoop
    samples: list[Obj] = field(default_factory=list)
    phases: list[Obj] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                obj = pdd(self.cp, self.ns, NAME) or {}
            except httpx.HTTPError as err:
                log.warning("sampling the PDDeployment failed: %s", err)
                continue
            st = status(obj)
            demand, capacity = st.get("demand") or {}, st.get("capacity") or {}
            self.samples.append(
                {
                    "t": round(self.load.now(), 2),
                    "offered": self.load.rate,
                    "replicas": obj.get("spec", {}).get("replicas"),
                    "available": st.get("availableReplicas", 0),
                    "demand": demand.get("requestsPerSecond"),
                    "queued": demand.get("queued"),
                    "inFlight": demand.get("inFlight"),
                    "capacity": capacity.get("requestsPerSecond"),
                }
            )

    def phase(self, name: str, rate: float) -> None:
        self.load.rate = rate
        self.phases.append({"name": name, "t": round(self.load.now(), 2), "rate": round(rate, 3)})
        log.info("ramp phase %s: %.2f req/s", name, rate)

    def gaps(self) -> list[tuple[float, float]]:
        """From each scale-up (the first sample with more replicas) until they are all available, plus the
        TTFT bound (what arrived before then may have queued behind the replicas still starting)."""
        found: list[tuple[float, float]] = []
        for before, after in zip(self.samples, self.samples[1:], strict=False):
            if (after["replicas"] or 0) > (before["replicas"] or 0):
                ready = [s["t"] for s in self.samples if s["t"] >= after["t"] and s["available"] >= after["replicas"]]
                found.append((before["t"], (ready[0] if ready else math.inf) + SLO.ttft_ms / 1000))
        return found


def attainment(sent: list[Sent]) -> float:
    return sum(s.good for s in sent) / len(sent) if sent else 1.0


def wait_replicas(cp: ControlPlane, ns: str, replicas: int, timeout_s: float) -> Obj:
    """spec.replicas and available replicas at ``replicas``, and no other serving pod left."""

    def done() -> Obj | None:
        obj = pdd(cp, ns, NAME)
        counts = ((obj or {}).get("spec", {}).get("replicas"), status(obj).get("availableReplicas"))
        return obj if counts == (replicas, replicas) and len(pods(cp, ns, SELECTOR)) == replicas else None

    return wait_for(done, timeout_s, f"{replicas} available replicas", interval_s=0.5)


def scaling_events(cp: ControlPlane, ns: str) -> list[Obj]:
    found = pdd_events(cp, ns, NAME, "ScaledUp") + pdd_events(cp, ns, NAME, "ScaledDown")
    return sorted(found, key=event_time)


def event_time(event: Obj) -> float:
    return datetime.fromisoformat(event.get("firstTimestamp") or event["eventTime"]).timestamp()


def wide_columns(cp: ControlPlane, ns: str) -> dict[str, str]:
    """`kubectl get pdd -o wide` as the API server's Table (what kubectl prints): column name -> cell."""
    with cp.http() as client:
        resp = client.get(
            f"{GROUP_PATH}/namespaces/{ns}/pddeployments/{NAME}",
            headers={"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"},
            params={"includeObject": "None"},
        )
    resp.raise_for_status()
    table = resp.json()
    names = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(names, (str(c) for c in table["rows"][0]["cells"]), strict=True))


def operator_gauges(stack: Stack, ns: str) -> dict[str, float]:
    """The operator's autoscaling gauges for this PDDeployment, from its /metrics."""
    text = httpx.get(stack.operator_metrics_url(), timeout=10, trust_env=False).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels == {"namespace": ns, "name": NAME}
    }


def write_timeline(cp: ControlPlane, document: Obj) -> None:
    targets = [cp.workdir / "logs" / "autoscaling-ramp.json"]
    if chosen := os.environ.get("PD_E2E_RAMP_TIMELINE"):
        targets.append(Path(chosen))
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1))
        log.info("ramp timeline written to %s", path)


def test_a_ramp_scales_one_to_three_and_back_by_draining_with_no_failed_request(
    operator: Stack, cp: ControlPlane, ns: str, nodes: list[str]
) -> None:
    apply(cp, json.dumps(manifest()), ns)
    measured = wait_for(
        lambda: (c := status(pdd(cp, ns, NAME)).get("capacity")) and c.get("source") == "measured" and c,
        600,
        "the goodput search's capacity in status.capacity",
        interval_s=1,
    )
    capacity = float(measured["requestsPerSecond"])
    log.info("measured capacity: %s", measured)
    # The probe's own requests are demand too: let them leave the proxies' window before the ramp.
    wait_for(
        lambda: float((status(pdd(cp, ns, NAME)).get("demand") or {}).get("requestsPerSecond", 1e9)) < 0.1 * capacity,
        120,
        "the probe's requests out of the demand window",
    )
    wait_replicas(cp, ns, 1, 180)
    started = time.time()

    endpoints = ReadyEndpoints(cp, ns, NAME)
    load = OpenLoop(endpoints, MODEL, SLO, PROMPT_TOKENS, OUTPUT_TOKENS, refresh_s=0.02)
    with endpoints, load, Timeline(cp, ns, load) as timeline, PodWatch(cp, ns, SELECTOR) as changes:
        timeline.phase("low", 0.3 * capacity)
        time.sleep(15)
        timeline.phase("rising", 0.7 * capacity)
        rising_wall = time.time()
        wait_replicas(cp, ns, 2, 240)
        time.sleep(10)
        timeline.phase("peak", 1.4 * capacity)
        wait_replicas(cp, ns, 3, 240)
        time.sleep(10)
        peak = wide_columns(cp, ns), operator_gauges(operator, ns), status(pdd(cp, ns, NAME))
        timeline.phase("falling", 0.3 * capacity)
        wait_replicas(cp, ns, 1, 300)
        time.sleep(5)
        timeline.phase("stopped", 0.0)
    events = scaling_events(cp, ns)
    gaps = timeline.gaps()
    outside = [s for s in load.sent if not any(a <= s.at <= b for a, b in gaps)]
    write_timeline(
        cp,
        {
            "capacity": measured,
            "slo": asdict(SLO),
            "targetUtilization": TARGET_UTILIZATION,
            "windows": {"up": UP_WINDOW_S, "down": DOWN_WINDOW_S},
            "timeScale": TIME_SCALE,
            "phases": timeline.phases,
            "samples": timeline.samples,
            "gaps": gaps,
            "requests": [asdict(s) for s in load.sent],
            "events": [
                {"reason": e["reason"], "message": e["message"], "time": e.get("firstTimestamp")} for e in events
            ],
        },
    )
    failed = [s for s in load.sent if s.error is not None]
    log.info(
        "ramp: %d requests, %d failed, attainment %.3f outside the start-up gaps %s (%.3f overall), %.0f s",
        len(load.sent),
        len(failed),
        attainment(outside),
        gaps,
        attainment(load.sent),
        time.time() - started,
    )

    # 1 -> 2 -> 3 -> 2 -> 1, one Event per step saying why; never two decisions for one need.
    steps = [e["message"].rsplit("replicas ", 1)[-1] for e in events]
    assert steps == ["1 -> 2", "2 -> 3", "3 -> 2", "2 -> 1"], [e["message"] for e in events]
    per = f"{capacity:.3g} req/s"
    assert f"> {TARGET_UTILIZATION:g} x 1 x {per}" in events[0]["message"]
    assert f"> {TARGET_UTILIZATION:g} x 2 x {per}" in events[1]["message"]
    assert f"<= {TARGET_UTILIZATION:g} x 3 x {per}" in events[2]["message"]
    assert f"<= {TARGET_UTILIZATION:g} x 2 x {per}" in events[3]["message"]
    waited = event_time(events[0]) - rising_wall
    assert waited >= UP_WINDOW_S - 1, f"scaled up {waited:.0f} s after the rise: before the up window"

    # Scale-down drains: the replicas removed are the newest, one at a time, and one always served.
    assert changes.deleting == {f"{NAME}-1", f"{NAME}-2"}, changes.deleting
    assert changes.fewest_ready is not None and changes.fewest_ready >= 1

    # The client: the SLO's target outside the start-up gaps (no failed request at all: checked last).
    assert len(outside) >= 100, f"too few requests outside the start-up gaps to judge: {len(outside)}"
    assert attainment(outside) >= SLO.target, f"attainment {attainment(outside):.3f} outside the gaps {gaps}"

    # Capacity and demand where users and other autoscalers read them.
    columns, gauges, at_peak = peak
    assert columns["Capacity"] == at_peak["capacity"]["summary"] and "measured" in columns["Capacity"]
    assert columns["Demand"].endswith("/s") and float(columns["Demand"][:-2]) > 0
    assert gauges["pd_operator_capacity_requests_per_second"] == pytest.approx(capacity)
    assert gauges["pd_operator_demand_requests_per_second"] > capacity
    assert gauges["pd_operator_desired_replicas"] == 3
    wide = cp.kubectl("get", "pdd", NAME, "-n", ns, "-o", "wide").splitlines()
    assert "CAPACITY" in wide[0].split() and "DEMAND" in wide[0].split() and "measured" in wide[1]

    # No failed request at all, not even one in flight on a replica as it was removed.
    assert not failed, f"{len(failed)} failed requests: {failed[:10]}"
