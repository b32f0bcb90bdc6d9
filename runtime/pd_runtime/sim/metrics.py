"""Prometheus metrics under vLLM's names, plus the simulator's own KV-handoff counters.

Latencies are wall-clock seconds as this process lived them (with --time-scale 10 a modelled 1 s TTFT
shows as 0.1 s), so they compare directly with what a client measured.

With ``--sim-moriio-metrics`` the engine also exports the MoRI-IO connector's transfer metrics of vLLM's
main branch (``vllm/distributed/kv_transfer/kv_connector/v1/moriio/stats.py``, ``MoRIIOPromMetrics``),
with its names, labels and buckets; no release through 0.34 has them, so by default none are exported.
"""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


# vLLM main's MoRIIOPromMetrics buckets: transfer time (its time buckets less the first), post time,
# bytes (2 KiB to 16 GiB, as NIXL's) and descriptors per transfer.
_MORIIO_POST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
_MORIIO_XFER_BUCKETS = _MORIIO_POST_BUCKETS[1:]
_MORIIO_BYTE_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
_MORIIO_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)


class MoriioTransferMetrics:
    """vLLM main's ``vllm:moriio_*`` families, one series per engine core (labels model_name, engine),
    all created at start as vLLM's ``create_metric_per_engine`` does."""

    def __init__(self, registry: CollectorRegistry, model_name: str, ranks: int) -> None:
        labels = ["model_name", "engine"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self._model = model_name
        self.xfer_time = histogram(
            "vllm:moriio_xfer_time_seconds",
            "Histogram of transfer duration for MoRI IO KV Cache transfers.",
            _MORIIO_XFER_BUCKETS,
        )
        self.post_time = histogram(
            "vllm:moriio_post_time_seconds",
            "Histogram of transfer post time for MoRI IO KV Cache transfers.",
            _MORIIO_POST_BUCKETS,
        )
        self.bytes = histogram(
            "vllm:moriio_bytes_transferred",
            "Histogram of bytes transferred per MoRI IO KV Cache transfers.",
            _MORIIO_BYTE_BUCKETS,
        )
        self.descriptors = histogram(
            "vllm:moriio_num_descriptors",
            "Histogram of number of descriptors per MoRI IO KV Cache transfers.",
            _MORIIO_DESCRIPTOR_BUCKETS,
        )
        self.failed_transfers = counter(
            "vllm:moriio_num_failed_transfers", "Number of failed MoRI IO KV Cache transfers."
        )
        self.failed_notifications = counter(
            "vllm:moriio_num_failed_notifications", "Number of failed MoRI IO KV Cache notifications."
        )
        self.kv_expired = counter(
            "vllm:moriio_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
        )
        families = (self.xfer_time, self.post_time, self.bytes, self.descriptors)
        for family in (*families, self.failed_transfers, self.failed_notifications, self.kv_expired):
            for rank in range(ranks):
                family.labels(model_name, str(rank))

    def transfer(self, rank: int, seconds: float, size: int, descriptors: int) -> None:
        """One successful transfer by engine core ``rank``; the simulator posts no RDMA work (post time 0)."""
        values = (self._model, str(rank))
        self.xfer_time.labels(*values).observe(seconds)
        self.post_time.labels(*values).observe(0.0)
        self.bytes.labels(*values).observe(size)
        self.descriptors.labels(*values).observe(descriptors)


class SchedulerGauges(NamedTuple):
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge


class EngineMetrics:
    def __init__(self, model_name: str, moriio_ranks: int = 0) -> None:
        """``moriio_ranks``: the engine cores whose ``vllm:moriio_*`` series to export; 0, none (every release)."""
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        reg = self.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels, buckets=_LATENCY_BUCKETS, registry=reg
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency.", labels, buckets=_ITL_BUCKETS, registry=reg
        ).labels(model_name)
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Mean time per output token of each request.",
            labels,
            buckets=_ITL_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Time in WAITING.", labels, buckets=_LATENCY_BUCKETS, registry=reg
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end latency.", labels, buckets=_LATENCY_BUCKETS, registry=reg
        ).labels(model_name)
        # The scheduler's gauges carry vLLM 0.31's per-engine-core label too (``engine``: the DP rank;
        # v1/metrics/loggers.py, PrometheusStatLogger: labelnames ["model_name", "engine"]), so that a
        # DP engine shows one series per rank, as the proxy's load-aware routing reads them.
        per_core = [*labels, "engine"]
        self._running = Gauge("vllm:num_requests_running", "Requests in a batch.", per_core, registry=reg)
        self._waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", per_core, registry=reg)
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", per_core, registry=reg
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens.", labels, registry=reg).labels(model_name)
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.", labels, registry=reg
        ).labels(model_name)
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.", labels, registry=reg
        ).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels, registry=reg).labels(
            model_name
        )
        # vLLM 0.31's prompt tokens by where their KV came from (v1/metrics/loggers.py,
        # PromptTokenStats.ALL_SOURCES), one series per engine core, all created at start.
        self._by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*per_core, "source"], registry=reg
        )
        self._success = Counter(
            "vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=reg
        )
        self._model = model_name
        self.handshakes = Counter(
            "pd_sim_kv_handshakes", "MoRI-IO handshakes over ZMQ (get_meta_msg).", ["direction"], registry=reg
        )
        self.notify = Counter(
            "pd_sim_kv_notify_messages", "Notify messages over ZMQ.", ["direction", "type"], registry=reg
        )
        self.transfers = Counter(
            "pd_sim_kv_transfers",
            "KV handoffs whose notify exchange finished (completed) or timed out (expired).",
            ["outcome"],
            registry=reg,
        )
        self.waiting_for_kv = Gauge(
            "pd_sim_requests_waiting_for_kv",
            "Decode requests waiting for KV from a prefill engine (WAITING_FOR_REMOTE_KVS).",
            registry=reg,
        )
        self.preemptions = Counter(
            "pd_sim_preemptions", "Running sequences preempted because the KV cache was full.", registry=reg
        )
        self.decoded_without_kv = Counter(
            "pd_sim_requests_decoded_without_kv",
            "Read-mode decode requests that claimed a prompt KV they never loaded (vLLM < 0.33; wrong output).",
            registry=reg,
        )
        self.blocks_held = Gauge(
            "pd_sim_kv_blocks_held", "Producer blocks kept for a decode engine (delay-freed).", registry=reg
        )

        self.moriio = MoriioTransferMetrics(reg, model_name, moriio_ranks) if moriio_ranks else None

    def moriio_transfer(self, rank: int, seconds: float, size: int, descriptors: int) -> None:
        if self.moriio is not None:
            self.moriio.transfer(rank, seconds, size, descriptors)

    def moriio_failed_transfer(self, rank: int) -> None:
        if self.moriio is not None:
            self.moriio.failed_transfers.labels(self._model, str(rank)).inc()

    def moriio_kv_expired(self, rank: int) -> None:
        if self.moriio is not None:
            self.moriio.kv_expired.labels(self._model, str(rank)).inc()

    def scheduler_gauges(self, rank: int) -> SchedulerGauges:
        """The running, waiting and KV-usage gauges of one engine core (DP rank)."""
        values = (self._model, str(rank))
        return SchedulerGauges(
            self._running.labels(*values), self._waiting.labels(*values), self._kv_usage.labels(*values)
        )

    def prompt_sources(self, rank: int, **tokens: int) -> None:
        """Count a request's prompt tokens by source (``local_compute``, ``local_cache_hit``,
        ``external_kv_transfer``) on engine core ``rank``."""
        for source in PROMPT_SOURCES:
            self._by_source.labels(self._model, str(rank), source).inc(tokens.get(source, 0))

    def success(self, reason: str) -> None:
        self._success.labels(self._model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
