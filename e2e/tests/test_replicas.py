"""Replicas across real nodes: `kubectl scale` 1 -> 2 -> 1 (the removed replica answers in full whatever it
accepts while it drains, its engines held up by their preStop hook under the kubelet), a rolling update
under a live probe, a node drain that the PodDisruptionBudget holds back.

Two real 8-GPU nodes (the shared GPU pool, its GPUs from the fake MI300X device plugins); each replica
reserves every GPU of a node, so the scheduler puts one replica per node. The tests run in file order
on one deployment, each leaving it as the next expects. The live probe is a client that spreads
streamed completions over the Service's ready endpoints, read from its EndpointSlices as kube-proxy
would; every failed request is attributed to the pod it went to, so the rolling update's errors can be
told apart: those in flight on a replaced pod, and any others (which must be none).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from e2e.cluster import ControlPlane
from e2e.stack import GPU_POOL, pool_placement
from e2e.tests.kube import (
    Background,
    Obj,
    PodWatch,
    apply,
    create_namespace,
    get,
    pdd,
    pods,
    ready_addresses,
    simulated_example,
    wait_for,
)

log = logging.getLogger(__name__)
NODES = 2  # as many replicas at most, one per node
NAME = "rep"
SELECTOR = f"app.kubernetes.io/component=serving,pd.serving.dev/deployment={NAME}"


@pytest.fixture(scope="module")
def ns(cp: ControlPlane) -> Iterator[str]:
    name = create_namespace(cp, "t-replicas")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def nodes(real_pool: Callable[[str, int], list[str]]) -> list[str]:
    return real_pool(GPU_POOL, NODES)


def manifest(replicas: int, grace_s: int = 5) -> Obj:
    obj = simulated_example(NAME)
    spec = obj["spec"]
    spec["replicas"] = replicas
    spec["node"] = pool_placement(GPU_POOL)
    spec["simulation"]["reserveGpus"] = True  # a whole node per replica
    spec["goodputProbe"]["enabled"] = False
    spec["proxy"]["canaryIntervalSeconds"] = 2  # a verified KV transfer soon after each pod starts
    spec["terminationGracePeriodSeconds"] = grace_s
    return obj


def serving(cp: ControlPlane, ns: str) -> list[Obj]:
    return sorted(pods(cp, ns, SELECTOR), key=lambda p: p["metadata"]["name"])


def wait_replicas(cp: ControlPlane, ns: str, replicas: int, timeout_s: float = 180) -> Obj:
    """Ready with `replicas` ready, available and updated replicas, and no other serving pod left."""

    def done() -> Obj | None:
        obj = pdd(cp, ns, NAME) or {}
        st = obj.get("status") or {}
        counts = (st.get("replicas"), st.get("readyReplicas"), st.get("availableReplicas"), st.get("updatedReplicas"))
        current = st.get("observedGeneration") == obj["metadata"]["generation"]
        if st.get("phase") == "Ready" and current and counts == (replicas,) * 4 and len(serving(cp, ns)) == replicas:
            return obj
        return None

    try:
        return wait_for(done, timeout_s, f"{replicas} ready replicas")
    except AssertionError as err:
        pods_now = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase")) for p in serving(cp, ns)
        ]
        raise AssertionError(f"{err}; status: {(pdd(cp, ns, NAME) or {}).get('status')}; pods: {pods_now}") from None


def budget(cp: ControlPlane, ns: str) -> Obj:
    return get(cp, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{NAME}") or {}


def kubectl_get_wide(cp: ControlPlane, ns: str) -> dict[str, str]:
    out = cp.kubectl("get", "pdd", NAME, "-n", ns, "-o", "wide").splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=False))


# ---- the live probe -------------------------------------------------------------------------------------


@dataclass
class Probe:
    """Streamed completions, two at a time, to the Service's ready endpoints (round robin)."""

    cp: ControlPlane
    ns: str
    stop: threading.Event = field(default_factory=threading.Event)
    ok: Counter[str] = field(default_factory=Counter)  # pod IP -> completed requests
    failed: Counter[str] = field(default_factory=Counter)  # pod IP -> failed requests
    endpoints: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: int = 0

    def ready_endpoints(self) -> list[str]:
        return ready_addresses(self.cp, self.ns, NAME)

    def watch(self) -> None:
        while not self.stop.is_set():
            try:
                found = self.ready_endpoints()
            except httpx.HTTPError:
                found = self.endpoints
            with self.lock:
                self.endpoints = found
            time.sleep(0.3)

    def pick(self) -> str | None:
        with self.lock:
            if not self.endpoints:
                return None
            self.turn += 1
            return self.endpoints[self.turn % len(self.endpoints)]

    def client(self) -> None:
        body = {"model": "Qwen/Qwen3-235B-A22B-FP8", "prompt": "roll", "max_tokens": 8, "stream": True}
        while not self.stop.is_set():
            ip = self.pick()
            if ip is None:
                time.sleep(0.1)
                continue
            try:
                url = f"http://{ip}:8000/v1/completions"
                with httpx.stream("POST", url, json=body, timeout=30, trust_env=False) as resp:
                    lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
                good = resp.status_code == 200 and lines and lines[-1] == "data: [DONE]"
                good = good and not any('"error"' in line for line in lines)
            except httpx.HTTPError:
                good = False
            (self.ok if good else self.failed)[ip] += 1

    def __enter__(self) -> Probe:
        self.endpoints = self.ready_endpoints()
        self.threads = [threading.Thread(target=self.watch, daemon=True)]
        self.threads += [threading.Thread(target=self.client, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)


# ---- the tests, in order ----------------------------------------------------------------------------------


def test_kubectl_scale_to_two_puts_one_replica_per_node(cp: ControlPlane, ns: str, nodes: list[str]) -> None:
    apply(cp, json.dumps(manifest(1)), ns)
    wait_replicas(cp, ns, 1)
    cp.kubectl("scale", f"pdd/{NAME}", "-n", ns, "--replicas", str(NODES))
    obj = wait_replicas(cp, ns, NODES)
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in serving(cp, ns)}
    assert sorted(placed) == [NAME, f"{NAME}-1"] and sorted(placed.values()) == sorted(nodes)
    for found in serving(cp, ns):
        ids = [c["containerID"] for c in found["status"]["containerStatuses"]]
        assert len(ids) == 3 and all(cid.startswith("containerd://") for cid in ids), ids
    st = obj["status"]
    assert st["ready"] == "2/2" and [r["phase"] for r in st["replicaStatuses"]] == ["Ready"] * NODES
    assert all(r["available"] and r["kvTransfer"]["status"] == "True" for r in st["replicaStatuses"])
    scale = get(cp, f"/apis/pd.serving.dev/v1alpha1/namespaces/{ns}/pddeployments/{NAME}/scale") or {}
    assert scale["spec"]["replicas"] == NODES and scale["status"] == {"replicas": NODES, "selector": SELECTOR}
    wide = kubectl_get_wide(cp, ns)
    assert (wide["READY"], wide["CONTAINERS"], wide["AVAILABLE"]) == ("2/2", "6/6", "2")
    assert budget(cp, ns)["spec"]["minAvailable"] == 1
    wait_for(lambda: budget(cp, ns).get("status", {}).get("currentHealthy") == NODES, 30, "the budget to count both")


def test_a_spec_change_rolls_one_replica_at_a_time_under_a_live_probe(cp: ControlPlane, ns: str) -> None:
    before = {p["metadata"]["name"]: p["status"]["podIP"] for p in serving(cp, ns)}
    with Probe(cp, ns) as probe, PodWatch(cp, ns, SELECTOR) as changes:
        time.sleep(2)
        assert sum(probe.ok.values()) > 0 and not probe.failed, (probe.ok, probe.failed)
        apply(cp, json.dumps(manifest(NODES, grace_s=6)), ns)  # the pod spec changes: every pod rolls

        def rolled() -> bool:
            obj = pdd(cp, ns, NAME) or {}
            st = obj.get("status") or {}
            current = st.get("observedGeneration") == obj["metadata"]["generation"]
            done = (st.get("updatedReplicas"), st.get("availableReplicas"), st.get("phase")) == (NODES, NODES, "Ready")
            return current and done

        wait_for(rolled, 300, "every replica updated and available", interval_s=0.2)
        time.sleep(1)
    seen_deleting, fewest_ready = changes.deleting, changes.fewest_ready
    after = {p["metadata"]["name"]: p["status"]["podIP"] for p in serving(cp, ns)}
    replaced = set(before.values()) - set(after.values())
    on_replaced = sum(n for ip, n in probe.failed.items() if ip in replaced)
    elsewhere = {ip: n for ip, n in probe.failed.items() if ip not in replaced}
    log.info(
        "rolling update: %d requests ok, %d failed on the replaced pods (in flight when they went), "
        "%d elsewhere; fewest ready pods %d",
        sum(probe.ok.values()),
        on_replaced,
        sum(elsewhere.values()),
        fewest_ready,
    )
    assert seen_deleting == set(before) and len(replaced) == NODES, f"every replica was replaced: {before} -> {after}"
    assert fewest_ready is not None and fewest_ready >= NODES - 1, "at most maxUnavailable (1) out of service at once"
    assert not elsewhere, f"errors on pods that were not being replaced: {elsewhere}"
    assert on_replaced <= 2 * NODES, "at most the requests in flight (2 clients) on each replaced pod"
    wait_replicas(cp, ns, NODES)


def test_a_node_drain_evicts_one_replica_and_the_budget_blocks_the_next(
    cp: ControlPlane, ns: str, nodes: list[str]
) -> None:
    first, second = nodes[0], nodes[1]
    try:
        cp.kubectl("drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s")
        assert first not in {p["spec"].get("nodeName") for p in serving(cp, ns)}
        # the replacement cannot land anywhere (the other node's GPUs are taken): 1 of 2 serves
        wait_for(lambda: ((pdd(cp, ns, NAME) or {}).get("status") or {}).get("readyReplicas") == 1, 60, "1 ready")
        blocked = cp.kubectl(
            "drain", second, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=10s", check=False
        )
        on_second = [p for p in serving(cp, ns) if p["spec"].get("nodeName") == second]
        assert on_second and not on_second[0]["metadata"].get("deletionTimestamp"), blocked
        status = (pdd(cp, ns, NAME) or {})["status"]
        assert status["ready"] == "1/2" and status["phase"] in ("Pending", "Progressing")
    finally:
        cp.kubectl("uncordon", first, check=False)
        cp.kubectl("uncordon", second, check=False)
    wait_replicas(cp, ns, NODES)


@dataclass
class Removed(Background):
    """Back-to-back streamed completions straight to one replica's pod IP (not through the endpoints), each
    on a new connection, until its proxy stops accepting them: what it answers during its drain must be
    answered in full."""

    join_s = 40.0  # a request in flight may take its 30 s read timeout

    ip: str
    done: int = 0  # 200 with the whole stream
    broken: list[str] = field(default_factory=list)  # any other answer: a 5xx, an error event, a stream cut short
    refused: str = ""  # how it ended: a refused connect (the proxy no longer listens), or 503

    def run(self) -> None:
        body = {"model": "Qwen/Qwen3-235B-A22B-FP8", "prompt": "drain", "max_tokens": 8, "stream": True}
        url, headers = f"http://{self.ip}:8000/v1/completions", {"Connection": "close"}
        # A connection dropped before any answer is the end only if the next connect is refused (the listener
        # closed as it was accepted); if the proxy answers again, that request was lost.
        dropped = ""
        with httpx.Client(timeout=httpx.Timeout(30, connect=5), trust_env=False) as client:
            while not self.stop.is_set() and not self.refused:
                try:
                    with client.stream("POST", url, json=body, headers=headers) as resp:
                        try:
                            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
                        except httpx.HTTPError as err:
                            self.broken.append(f"{resp.status_code}, cut: {err!r}")
                            continue
                except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                    self.refused = repr(err)
                    continue
                except httpx.HTTPError as err:
                    self.broken += [dropped] if dropped else []
                    dropped = f"no answer: {err!r}"
                    continue
                self.broken += [dropped] if dropped else []
                dropped = ""
                whole = lines[-1:] == ["data: [DONE]"] and not any('"error"' in line for line in lines)
                if resp.status_code == 503:
                    self.refused = "503"
                elif resp.status_code == 200 and whole:
                    self.done += 1
                else:
                    self.broken.append(f"{resp.status_code}: {lines[-2:]}")


def test_kubectl_scale_back_to_one(cp: ControlPlane, ns: str) -> None:
    """The removed replica drains: a client that keeps sending straight to it until its proxy stops
    listening gets every request the proxy accepted answered in full, those of its drain delay too, after
    the pod's deletion: the engines' preStop hook holds their SIGTERM until the proxy is gone."""
    [removed] = [p["status"]["podIP"] for p in serving(cp, ns) if p["metadata"]["name"] != NAME]
    with Removed(removed) as one:
        wait_for(lambda: one.done, 30, "requests answered by the replica to be removed")
        cp.kubectl("scale", f"pdd/{NAME}", "-n", ns, "--replicas", "1")
        obj = wait_replicas(cp, ns, 1)
        wait_for(lambda: one.refused, 30, "the removed proxy to stop taking requests")
    log.info("removed replica: %s", (one.ip, one.done, one.broken, one.refused))
    assert not one.broken, (one.ip, one.broken)
    assert [p["metadata"]["name"] for p in serving(cp, ns)] == [NAME]
    assert obj["status"]["ready"] == "1/1" and len(obj["status"]["replicaStatuses"]) == 1
    assert budget(cp, ns)["spec"]["minAvailable"] == 0
