"""The serving pods' PodMonitor and the Grafana dashboard against what the operator and the runtime produce."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.utils import floatToGoString

from pd_operator import api, layout, render
from pd_operator import metrics as operator_metrics
from pd_operator.validation import validate_spec
from pd_runtime.proxy.metrics import TTFT_BUCKETS, ProxyMetrics
from pd_runtime.proxy.registry import Registry
from pd_runtime.sim.metrics import EngineMetrics
from tests.chart.chart_helpers import CHART, documents, find
from tests.chart.chart_helpers import render as helm_render
from tests.chart.promql import label_values_metrics, metric_names
from tests.operator.conftest import EXAMPLES, load_example

DASHBOARD = CHART / "dashboards" / "pd-serving.json"
VLLM_METRICS = Path(__file__).with_name("vllm-0.29-metrics.txt")
# Assumed from kube-state-metrics (not run here): its per-container restart counter, labelled
# namespace, pod and container.
KUBE_STATE_METRICS = {"kube_pod_container_status_restarts_total"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created")}
MONITORING = ["metrics.podMonitor.enabled=true", "metrics.grafanaDashboard.enabled=true"]


def _samples(families: Iterable[tuple[str, str]]) -> set[str]:
    return {name + suffix for kind, name in families for suffix in SUFFIXES[kind]}


def vllm_main_moriio_families() -> list[tuple[str, str]]:
    """vLLM main's MoRI-IO transfer families (docs/vllm-versions.md), as the simulator exports them under
    vLLM's names when asked: no release has them."""
    families = EngineMetrics("m", moriio_ranks=1).registry.collect()
    return [(f.type, f.name) for f in families if f.name.startswith("vllm:moriio_")]


def exported_metrics() -> set[str]:
    """Every sample name the proxy, the operator, vLLM 0.29 and vLLM main's MoRI-IO connector expose, and the
    kube-state-metrics one we use."""
    proxy = ProxyMetrics(Registry("disaggregated", "auto", None, []))
    families = [(f.type, f.name) for f in proxy.registry.collect()]
    for value in vars(operator_metrics).values():
        if isinstance(value, MetricWrapperBase):
            families += [(f.type, f.name) for f in value.describe()]
    lines = [line.split() for line in VLLM_METRICS.read_text().splitlines() if line and not line.startswith("#")]
    families += [(kind, name) for kind, name in lines] + vllm_main_moriio_families()
    return _samples(families) | KUBE_STATE_METRICS


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def serving_pods() -> list[dict[str, Any]]:
    owner = layout.Owner(name="x")
    return [render.pod(layout.build(owner, validate_spec(load_example(p.name)["spec"]))) for p in EXAMPLES]


def metrics_ports(pod: dict[str, Any]) -> set[str]:
    """Names of the ports that serve /metrics: each engine's HTTP port (its probes'), the proxy's admin port."""
    names = set()
    for container in pod["spec"]["containers"]:
        if container["name"] == render.PROXY_CONTAINER:
            names |= {p["name"] for p in container["ports"] if p["name"] == "admin"}
        else:
            names.add(container["readinessProbe"]["httpGet"]["port"])
    return names


@pytest.fixture(scope="module")
def pod_monitor(helm: Path) -> dict[str, Any]:
    (found,) = find(documents(helm_render(helm, sets=MONITORING)), "PodMonitor")
    return found


def test_pod_monitor_scrapes_every_metrics_port_of_every_example(pod_monitor: dict[str, Any]) -> None:
    endpoints = pod_monitor["spec"]["podMetricsEndpoints"]
    scraped = {e["port"] for e in endpoints}
    pods = serving_pods()
    every_port = set().union(*(metrics_ports(p) for p in pods))
    assert {"p-http", "d-http", "p0-http", "p1-http", "e0-http", "admin"} <= every_port
    assert every_port <= scraped
    # and every name the operator can give an engine's HTTP port, up to the most instances per role
    per_instance = {f"{r}{i}-http" for r in "pd" for i in range(api.MAX_ROLE_INSTANCES)}
    assert scraped == {"p-http", "d-http", "e0-http", "e1-http", "admin"} | per_instance
    assert {e["path"] for e in endpoints} == {"/metrics"}


def test_pod_monitor_selects_serving_pods_only(pod_monitor: dict[str, Any]) -> None:
    selector = pod_monitor["spec"]["selector"]["matchLabels"]
    owner = layout.Owner(name="x")
    assert selector.items() <= render.labels(owner, render.COMPONENT_SERVING).items()
    assert not selector.items() <= render.labels(owner, render.COMPONENT_PROBE).items()
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    (relabel,) = pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    sanitized = "".join(c if c.isalnum() else "_" for c in render.LABEL_DEPLOYMENT)
    assert relabel["sourceLabels"] == [f"__meta_kubernetes_pod_label_{sanitized}"]


def test_pod_monitor_watches_only_the_watched_namespaces(helm: Path) -> None:
    sets = [*MONITORING, "watchNamespaces={team-a,team-b}"]
    (found,) = find(documents(helm_render(helm, sets=sets)), "PodMonitor")
    assert found["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_no_monitoring_objects_by_default(helm: Path) -> None:
    docs = documents(helm_render(helm))
    assert not find(docs, "PodMonitor")
    assert not [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


def test_dashboard_config_map_carries_the_file_for_the_grafana_sidecar(helm: Path) -> None:
    configs = find(documents(helm_render(helm, sets=MONITORING)), "ConfigMap")
    (config_map,) = [d for d in configs if d["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["pd-serving.json"]) == dashboard()


@pytest.mark.parametrize(("title", "expr"), panel_queries(), ids=[t for t, _ in panel_queries()])
def test_every_panel_query_names_only_exported_metrics(title: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{title}: no metric in {expr!r}"
    assert names <= exported_metrics(), f"{title}: not exported: {sorted(names - exported_metrics())}"


def test_variable_queries_name_only_exported_metrics() -> None:
    queries = [v["query"]["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    assert queries
    for query in queries:
        assert label_values_metrics(query) <= exported_metrics(), query


def test_ttft_slo_choices_are_buckets_of_the_proxy_histogram() -> None:
    (slo,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "ttft_slo"]
    assert set(slo["query"].split(",")) <= {floatToGoString(b) for b in TTFT_BUCKETS}


def test_dashboard_covers_the_promised_views() -> None:
    queries = " ".join(expr for _, expr in panel_queries())
    for metric in (
        "pd_proxy_ttft_seconds_bucket",
        "pd_proxy_itl_seconds_bucket",
        "pd_proxy_leg_seconds_bucket",
        "vllm:num_requests_waiting",
        "kube_pod_container_status_restarts_total",
        # vLLM main's own transfer failures, expired KV, times and bytes, under vLLM's names
        "vllm:moriio_num_failed_transfers_total",
        "vllm:moriio_num_failed_notifications_total",
        "vllm:moriio_num_kv_expired_reqs_total",
        "vllm:moriio_xfer_time_seconds_bucket",
        "vllm:moriio_bytes_transferred_sum",
    ):
        assert metric in queries
    assert len(vllm_main_moriio_families()) == 7  # vLLM main's MoRIIOPromMetrics: 4 histograms, 3 counters


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le, pod) (rate(a_bucket{x="$y", le=~"1.0"}[$__rate_interval]))', {"a_bucket"}),
        ("time() - max without (job) (vllm:x_total offset 5m) > bool 3", {"vllm:x_total"}),
        ("a / on (pod) group_left (container) b or sum(c)", {"a", "b", "c"}),
        ("histogram_quantile(0.99, rate(d[5m:1m]))", {"d"}),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
