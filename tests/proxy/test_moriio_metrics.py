"""vLLM's own MoRI-IO transfer metrics (its main branch): read off an engine's /metrics page, summed over
labels, shown per instance in /status under vLLM's names, and nothing for a release without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_runtime.protocol import Registration
from pd_runtime.proxy.listener import read_moriio_metrics
from pd_runtime.proxy.moriio_metrics import HistogramTotals, MoriioMetrics
from pd_runtime.proxy.registry import Registry
from pd_runtime.proxy.routing import Router
from pd_runtime.proxy.status import instance_json

RELEASED_PAGE = Path(__file__).parents[1] / "chart" / "vllm-0.29-metrics.txt"

# A DP2 engine's families as vLLM main's MoRIIOPromMetrics exposes them through prometheus_client (labels
# model_name and engine), a NIXL family alongside that must not be read, and a label value naming ours.
MAIN_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="vllm:moriio_lookalike"} 3.0
# HELP vllm:moriio_xfer_time_seconds Histogram of transfer duration for MoRI IO KV Cache transfers.
# TYPE vllm:moriio_xfer_time_seconds histogram
vllm:moriio_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="qwen"} 1.0
vllm:moriio_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 3.0
vllm:moriio_xfer_time_seconds_count{engine="0",model_name="qwen"} 3.0
vllm:moriio_xfer_time_seconds_sum{engine="0",model_name="qwen"} 0.25
vllm:moriio_xfer_time_seconds_bucket{engine="1",le="0.005",model_name="qwen"} 0.0
vllm:moriio_xfer_time_seconds_bucket{engine="1",le="+Inf",model_name="qwen"} 2.0
vllm:moriio_xfer_time_seconds_count{engine="1",model_name="qwen"} 2.0
vllm:moriio_xfer_time_seconds_sum{engine="1",model_name="qwen"} 0.5
# HELP vllm:moriio_xfer_time_seconds_created Histogram of transfer duration for MoRI IO KV Cache transfers.
# TYPE vllm:moriio_xfer_time_seconds_created gauge
vllm:moriio_xfer_time_seconds_created{engine="0",model_name="qwen"} 1.7e9
# HELP vllm:moriio_num_failed_transfers_total Number of failed MoRI IO KV Cache transfers.
# TYPE vllm:moriio_num_failed_transfers_total counter
vllm:moriio_num_failed_transfers_total{engine="0",model_name="qwen"} 2.0
vllm:moriio_num_failed_transfers_total{engine="1",model_name="qwen"} 1.0
# HELP vllm:moriio_num_failed_transfers_created Number of failed MoRI IO KV Cache transfers.
# TYPE vllm:moriio_num_failed_transfers_created gauge
vllm:moriio_num_failed_transfers_created{engine="0",model_name="qwen"} 1.7e9
# HELP vllm:moriio_num_kv_expired_reqs_total Number of requests that had their KV expire.
# TYPE vllm:moriio_num_kv_expired_reqs_total counter
vllm:moriio_num_kv_expired_reqs_total{engine="0",model_name="qwen"} 0.0
# HELP vllm:nixl_num_failed_transfers_total Number of failed NIXL KV Cache transfers.
# TYPE vllm:nixl_num_failed_transfers_total counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="qwen"} 9.0
"""


def test_counters_and_histograms_are_summed_over_their_labels_under_vllms_names() -> None:
    assert read_moriio_metrics(MAIN_PAGE) == MoriioMetrics(
        counters={"vllm:moriio_num_failed_transfers": 3.0, "vllm:moriio_num_kv_expired_reqs": 0.0},
        histograms={"vllm:moriio_xfer_time_seconds": HistogramTotals(count=5.0, sum=0.75)},
    )


def test_a_released_vllm_page_has_none_and_none_is_made_up() -> None:
    assert read_moriio_metrics(RELEASED_PAGE.read_text()) is None
    assert read_moriio_metrics("") is None


def test_a_malformed_family_line_raises_value_error() -> None:
    with pytest.raises(ValueError):
        read_moriio_metrics("# TYPE vllm:moriio_num_failed_transfers counter\nvllm:moriio_num_failed_transfers{x 1\n")


def _instance_json(moriio: MoriioMetrics | None) -> dict[str, object]:
    registry = Registry("disaggregated", "auto", None, [])
    registry.observe(Registration("P", "10.0.0.1", 8000, 6301, 6105, 1, 1, "WRITE", "G2"), now=0.0)
    registry.record_moriio("10.0.0.1:8000", moriio)
    inst = registry.instances["10.0.0.1:8000"]
    return instance_json(registry, Router("round_robin"), inst, now=0.0)


def test_status_shows_an_engines_families_or_null_without_them() -> None:
    parsed = read_moriio_metrics(MAIN_PAGE)
    assert _instance_json(parsed)["moriio_metrics"] == {
        "vllm:moriio_num_failed_transfers": 3.0,
        "vllm:moriio_num_kv_expired_reqs": 0.0,
        "vllm:moriio_xfer_time_seconds": {"count": 5.0, "sum": 0.75},
    }
    assert _instance_json(None)["moriio_metrics"] is None
