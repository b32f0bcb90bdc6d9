"""Prometheus metrics of the proxy (admin port ``/metrics``), on a registry of their own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pd_runtime.proxy.registry import Registry

# Seconds; TTFT spans a long prefill, ITL a single decode step.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5)
LEG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _RegistryCollector(Collector):
    """Reads registry sizes at scrape time, so the gauges are never stale."""

    def __init__(self, registry: Registry, clock: Callable[[], float]) -> None:
        self._registry = registry
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        known = GaugeMetricFamily("pd_proxy_instances", "Registered or listed instances by role", labels=["role"])
        live = GaugeMetricFamily("pd_proxy_instances_live", "Routable instances by role", labels=["role"])
        for role in ("P", "D", "E"):
            known.add_metric([role], sum(1 for i in self._registry.instances.values() if i.role == role))
            live.add_metric([role], len(self._registry.live(role, now)))
        yield known
        yield live


class ProxyMetrics:
    def __init__(self, registry: Registry, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "pd_proxy_requests", "Client requests by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.ttft = Histogram("pd_proxy_ttft_seconds", "Time to first relayed byte", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("pd_proxy_itl_seconds", "Gap between relayed reads", buckets=ITL_BUCKETS, registry=r)
        self.leg_seconds = Histogram(
            "pd_proxy_leg_seconds", "Upstream leg duration", ["leg"], buckets=LEG_BUCKETS, registry=r
        )
        self.upstream_errors = Counter(
            "pd_proxy_upstream_errors", "Failed upstream legs by leg and kind", ["leg", "kind"], registry=r
        )
        self.registration_frames = Counter(
            "pd_proxy_registration_frames", "Registration frames by result", ["result"], registry=r
        )
        self.evictions = Counter("pd_proxy_evictions", "Instances evicted (heartbeat TTL)", ["role"], registry=r)
        self.health_checks = Counter("pd_proxy_health_checks", "Instance /health probes", ["result"], registry=r)
        self.no_kv = Counter(
            "pd_proxy_no_kv",
            "Requests whose prefill gave no KV for decode, by answer: prefill_finished (prefill's own answer, "
            "its first token ended the request), prefill_plain (served on prefill as a plain request), error",
            ["answer"],
            registry=r,
        )
        self.in_flight = Gauge("pd_proxy_in_flight", "Client requests in progress", registry=r)
        self.decode_queue = Gauge(
            "pd_proxy_decode_queue", "Requests waiting for a decode DP rank below --decode-max-in-flight", registry=r
        )
        self.canary_ok = Gauge("pd_proxy_canary_ok", "1 if the last canary transfer succeeded", registry=r)
        self.last_transfer = Gauge(
            "pd_proxy_last_transfer_timestamp_seconds", "Unix time of the last verified P->D transfer", registry=r
        )
        r.register(_RegistryCollector(registry, clock))
