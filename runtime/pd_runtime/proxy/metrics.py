"""Prometheus metrics of the proxy (admin port ``/metrics``), on a registry of their own."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client import metrics as client_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from pd_runtime.proxy.breaker import STATE_VALUE
from pd_runtime.proxy.disaggregation import REASONS
from pd_runtime.proxy.registry import Registry

# Seconds; TTFT spans a long prefill, ITL a single decode step.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5)
LEG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Buckets:
    """One histogram's counts. Observed from the event loop only, so no lock: prometheus_client's
    Histogram takes a lock per bucket and per sum, about 1 us per observation, a third of the proxy's
    CPU per relayed chunk before (docs/benchmarks.md, "Profile")."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class LoopHistogram(Collector):
    """A histogram for one event loop's hot path, exposed exactly like prometheus_client's."""

    def __init__(
        self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry, label: str = ""
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.label = label
        self._children: dict[str, _Buckets] = {}
        self._unlabelled = _Buckets(self.bounds)
        registry.register(self)

    def observe(self, value: float) -> None:
        self._unlabelled.observe(value)

    def labels(self, value: str) -> _Buckets:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = _Buckets(self.bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label] if self.label else None)
        children = self._children.items() if self.label else [("", self._unlabelled)]
        for value, child in children:
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += count
                buckets.append((_bound_text(bound), cumulative))
            family.add_metric([value] if self.label else [], buckets, child.sum)
        yield family


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _Count:
    """One counter's value and when it was created (its ``_created`` sample)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopCounter(Collector):
    """A labelled counter for one event loop's hot path, exposed exactly like prometheus_client's Counter
    (``_total`` and ``_created`` per label set, in the order first counted). Counted from the event loop
    only: an increment adds to a float, where prometheus_client's child takes a lock (docs/benchmarks.md)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labels
        self._children: dict[tuple[str, ...], _Count] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Count:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _Count()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = client_metrics._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES, as prometheus_client reads it
        for values, child in self._children.items():
            family.add_metric(list(values), child.value, created=child.created if created else None)
        yield family


class _RegistryCollector(Collector):
    """Reads registry sizes at scrape time, so the gauges are never stale."""

    def __init__(self, registry: Registry, clock: Callable[[], float]) -> None:
        self._registry = registry
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        known = GaugeMetricFamily("pd_proxy_instances", "Registered or listed instances by role", labels=["role"])
        live = GaugeMetricFamily("pd_proxy_instances_live", "Routable instances by role", labels=["role"])
        circuit = GaugeMetricFamily(
            "pd_proxy_instance_circuit_state",
            "Each instance's circuit breaker: 0 closed (in rotation), 1 half-open (one trial request), 2 open",
            labels=["role", "instance"],
        )
        for role in ("P", "D", "E"):
            known.add_metric([role], sum(1 for i in self._registry.instances.values() if i.role == role))
            live.add_metric([role], len(self._registry.live(role, now)))
        for inst in self._registry.instances.values():
            circuit.add_metric([inst.role, inst.key], STATE_VALUE[inst.breaker.state])
        yield known
        yield live
        yield circuit


class ProxyMetrics:
    def __init__(self, registry: Registry, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter(
            "pd_proxy_requests", "Client requests by endpoint and outcome", ("endpoint", "outcome"), r
        )
        self.ttft = LoopHistogram("pd_proxy_ttft_seconds", "Time to first relayed byte", TTFT_BUCKETS, r)
        self.itl = LoopHistogram("pd_proxy_itl_seconds", "Gap between relayed reads", ITL_BUCKETS, r)
        self.leg_seconds = LoopHistogram("pd_proxy_leg_seconds", "Upstream leg duration", LEG_BUCKETS, r, label="leg")
        self.upstream_errors = Counter(
            "pd_proxy_upstream_errors", "Failed upstream legs by leg and kind", ["leg", "kind"], registry=r
        )
        self.registration_frames = Counter(
            "pd_proxy_registration_frames", "Registration frames by result", ["result"], registry=r
        )
        self.registration_peers = Gauge(
            "pd_proxy_registration_peers", "Open connections to the registration socket", registry=r
        )
        self.registration_peers_dropped = Counter(
            "pd_proxy_registration_peers_dropped",
            "Registration connections shut down, by reason: over_bound, refused_frame",
            ["reason"],
            registry=r,
        )
        self.evictions = Counter("pd_proxy_evictions", "Instances evicted (heartbeat TTL)", ["role"], registry=r)
        self.failures = Counter(
            "pd_proxy_failures",
            "Client requests failed, by cause (no_instance, overloaded, engine_failed, kv_transfer_failed, deadline, "
            "client_gone) and phase (before_headers: an HTTP error; after_first_byte: an error event and [DONE]): "
            "the cells of docs/proxy.md's failure table",
            ["cause", "phase"],
            registry=r,
        )
        self.failovers = Counter(
            "pd_proxy_failovers", "Requests served again on another instance after a leg failed", ["leg"], registry=r
        )
        self.migrations = Counter(
            "pd_proxy_migrations",
            "Decode streams broken after tokens reached the client, by outcome: ok (continued on another decode "
            "engine to the end), failed (the continuation failed too), limit_reached (--migration-limit used up), "
            "no_instance (no other decode engine routable), unsupported (a request that cannot be continued "
            "exactly: chat, stop strings, echo, prompt logprobs, nothing left of its budget)",
            ["outcome"],
            registry=r,
        )
        self.circuit_opens = Counter(
            "pd_proxy_circuit_opens",
            "Circuit breakers opened (instance out of rotation), by role and reason: timeout, failures, failover, "
            "trial (the half-open trial request failed)",
            ["role", "reason"],
            registry=r,
        )
        self.health_checks = Counter("pd_proxy_health_checks", "Instance /health probes", ["result"], registry=r)
        self.no_kv = Counter(
            "pd_proxy_no_kv",
            "Requests whose prefill gave no KV for decode, by answer: prefill_plain (served on prefill as a plain "
            "request), error",
            ["answer"],
            registry=r,
        )
        self.disaggregation = LoopCounter(
            "pd_proxy_disaggregation",
            "Client requests placed in disaggregated mode, by how they are served: disaggregated (prefill and "
            "decode legs), short_prompt or cached_prefix (on decode alone: the prompt, or its part decode has not "
            "cached, is below --disaggregation-threshold); a request failed over is placed again",
            ("reason",),
            r,
        )
        self.disaggregation_reasons = {reason: self.disaggregation.labels(reason) for reason in REASONS}
        self.kv_load_failures = Counter(
            "pd_proxy_kv_load_failures",
            "Decode legs that ended without output after prefill answered with KV: decode failed the request "
            "because its KV never loaded (write_failed from vLLM 0.33 in write mode, a failed read in read mode)",
            registry=r,
        )
        self.in_flight = Gauge("pd_proxy_in_flight", "Client requests in progress", registry=r)
        """Read when scraped (``ProxyCore`` sets its function): a locked ``inc`` and ``dec`` were per request."""
        self.decode_queue = Gauge(
            "pd_proxy_decode_queue", "Requests waiting for a decode DP rank below --decode-max-in-flight", registry=r
        )
        self.admission_queue = Gauge(
            "pd_proxy_admission_queue", "Client requests waiting for a slot below --max-in-flight", registry=r
        )
        """Read when scraped (``AdmissionGate`` sets its function)."""
        self.admission_rejections = Counter(
            "pd_proxy_admission_rejections",
            "Client requests answered 429 by admission, by reason: queue_full, queue_timeout",
            ["reason"],
            registry=r,
        )
        self.admission_wait = LoopHistogram(
            "pd_proxy_admission_wait_seconds", "Time admitted requests waited in the admission queue", TTFT_BUCKETS, r
        )
        self.api_refusals = Counter(
            "pd_proxy_api_refusals",
            "Requests and connections the API port refused before reading a body or running a handler, by reason: "
            "unauthenticated (no valid client key, or a body sent to /health or /ready), body_budget (503: the "
            "request bodies held across connections reached --body-budget-bytes), connection_cap (503: "
            "--max-connections open), head_timeout (408: no complete head within --head-timeout)",
            ["reason"],
            registry=r,
        )
        self.request_bytes_held = Gauge(
            "pd_proxy_request_bytes_held",
            "Request body bytes the API port holds (read and not yet answered), across connections",
            registry=r,
        )
        self.client_connections = Gauge(
            "pd_proxy_client_connections", "Client connections open on the API port", registry=r
        )
        self.canary_ok = Gauge("pd_proxy_canary_ok", "1 if the last canary transfer succeeded", registry=r)
        self.kv_canary = Counter(
            "pd_proxy_kv_canary",
            "Canary KV checks (decode's tokens after the transfer against prefill's own), by result: match, "
            "mismatch, unverified (the transfer or the reference failed, or an answer had no token ids)",
            ["result"],
            registry=r,
        )
        self.last_transfer = Gauge(
            "pd_proxy_last_transfer_timestamp_seconds", "Unix time of the last verified P->D transfer", registry=r
        )
        self.config_reloads = Counter(
            "pd_proxy_config_reloads",
            "Contents of the settings file (--config-file) evaluated, by result: applied, refused",
            ["result"],
            registry=r,
        )
        self.config_refused = Gauge(
            "pd_proxy_config_refused",
            "1 while the settings file's content is refused (the previous settings stay)",
            registry=r,
        )
        r.register(_RegistryCollector(registry, clock))

    def failed(self, cause: str, phase: str) -> None:
        self.failures.labels(cause, phase).inc()

    def api_refused(self, reason: str) -> None:
        self.api_refusals.labels(reason).inc()

    def request_done(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(endpoint, outcome).value += 1
