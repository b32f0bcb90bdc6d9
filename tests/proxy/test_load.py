"""Load-aware routing: the engines' own /metrics (vLLM 0.31 names) parsed, kept fresh, and routed by."""

from __future__ import annotations

from pathlib import Path

from pd_runtime.protocol import Registration
from pd_runtime.proxy.load import KV_USAGE, RUNNING, WAITING, EngineLoad, parse_engine_load
from pd_runtime.proxy.registry import LOAD_STALE_INTERVALS, Registry
from pd_runtime.proxy.routing import KV_USAGE_HIGH, Candidate, Router, least_load, slot_loads
from pd_runtime.sim.metrics import EngineMetrics

VLLM_FAMILIES = Path(__file__).parents[1] / "chart" / "vllm-0.29-metrics.txt"

# What vLLM 0.31's PrometheusStatLogger exposes for a DP2 engine (labels model_name and engine, the DP
# rank), with the neighbours that share a prefix, which must not be confused with the gauges.
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 5.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen",reason="capacity"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.75
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.125
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1234.0
"""


def test_parses_each_dp_rank_of_a_vllm_page() -> None:
    assert parse_engine_load(VLLM_PAGE) == {0: EngineLoad(3, 5, 0.75), 1: EngineLoad(1, 0, 0.125)}
    assert parse_engine_load("# nothing here\n") == {}


def test_the_names_read_are_vllms_own() -> None:
    families = {line.split()[1] for line in VLLM_FAMILIES.read_text().splitlines() if not line.startswith("#")}
    assert {RUNNING, WAITING, KV_USAGE} <= families


def test_the_simulator_exports_the_same_gauges_per_dp_rank() -> None:
    metrics = EngineMetrics("qwen")
    rank0, rank1 = metrics.scheduler_gauges(0), metrics.scheduler_gauges(1)
    rank0.running.set(2)
    rank0.waiting.set(4)
    rank1.kv_usage.set(0.5)
    page = metrics.render().decode()
    assert 'vllm:num_requests_running{engine="0",model_name="qwen"} 2.0' in page
    assert parse_engine_load(page) == {0: EngineLoad(2, 4, 0.0), 1: EngineLoad(0, 0, 0.5)}


A, B, C = ("a", None), ("b", None), ("c", None)


def test_least_load_prefers_the_shortest_engine_queue_over_equal_proxy_counts() -> None:
    loads = {A: EngineLoad(running=4, waiting=6), B: EngineLoad(running=2), C: EngineLoad(running=3)}
    assert least_load([A, B, C], {}, loads, counter=0) == B


def test_least_load_counts_what_the_proxy_sent_since_the_last_scrape() -> None:
    """A report one scrape old says idle; the proxy has just sent that engine three requests."""
    loads = {A: EngineLoad(), B: EngineLoad(running=1)}
    assert least_load([A, B], {A: 3}, loads, counter=0) == B


def test_least_load_sends_nothing_to_a_full_kv_cache_while_another_has_room() -> None:
    loads = {A: EngineLoad(running=0, kv_usage=KV_USAGE_HIGH), B: EngineLoad(running=9, kv_usage=0.5)}
    assert least_load([A, B], {}, loads, counter=0) == B
    assert least_load([A], {}, loads, counter=0) == A  # the only one: still served


def test_least_load_breaks_ties_by_waiting_then_kv_then_round_robin() -> None:
    assert least_load([A, B], {}, {A: EngineLoad(2, 2), B: EngineLoad(3, 1)}, 0) == B
    assert least_load([A, B], {}, {A: EngineLoad(2, 0, 0.4), B: EngineLoad(2, 0, 0.2)}, 0) == B
    assert [least_load([A, B, C], {}, {}, n) for n in range(3)] == [A, B, C]


def test_slot_loads_maps_dp_ranks_and_drops_ranks_the_instance_does_not_have() -> None:
    candidates = [
        Candidate("a", 2, {0: EngineLoad(1), 1: EngineLoad(2), 5: EngineLoad(9)}),
        Candidate("b", 1, {0: EngineLoad(3)}),
    ]
    assert slot_loads(candidates) == {("a", 0): EngineLoad(1), ("a", 1): EngineLoad(2), B: EngineLoad(3)}


def test_router_least_load_balances_two_prefill_instances_by_their_reports() -> None:
    router = Router("least_load")
    busy = [Candidate("a", 1, {0: EngineLoad(running=5)}), Candidate("b", 1, {0: EngineLoad(running=0)})]
    picks = []
    for _ in range(5):
        slot = router.pick("P", busy)
        assert slot is not None
        router.acquire(slot)
        picks.append(slot[0])
    # b takes requests until what the proxy has in flight there reaches a's reported queue
    assert picks == ["b"] * 5
    assert router.routed("b") == picks.count("b") and router.in_flight("b") == picks.count("b")


def test_a_stale_load_report_is_not_routed_by() -> None:
    registry = Registry("disaggregated", "auto", None, [], load_interval_s=1.0)
    reg = Registration(
        role="P", host="10.0.0.1", http_port=20005, handshake_port=6301, notify_port=6105,
        dp_size=1, tp_size=1, transfer_mode="WRITE", generation="G2",
    )  # fmt: skip
    registry.observe(reg, now=0.0)
    inst = registry.instances[reg.http_address]
    registry.record_load(inst.key, {0: EngineLoad(running=7)}, now=10.0)
    assert registry.fresh_load(inst, now=10.0 + LOAD_STALE_INTERVALS) == {0: EngineLoad(running=7)}
    assert registry.fresh_load(inst, now=10.1 + LOAD_STALE_INTERVALS) == {}
