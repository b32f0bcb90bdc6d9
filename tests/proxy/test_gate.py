"""Which registration frames may change the registry (gate.py and Registry.observe), in virtual time."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pd_runtime import protocol
from pd_runtime.protocol import Registration
from pd_runtime.proxy import gate
from pd_runtime.proxy.gate import RefusalSummary, TokenBucket, Verdict, judge, parse_expected_engine
from pd_runtime.proxy.registry import Registry

PREFILL = Registration("P", "10.0.0.7", 20005, 6301, 6105, 1, 4, "WRITE", "G2")
DECODE = Registration("D", "10.0.0.7", 40005, 7301, 7501, 1, 4, "WRITE", "G2")
EXPECTED = gate.expected_by_address([PREFILL, DECODE])


def _frame(payload: dict[str, object]) -> Registration:
    """A frame as the listener gets it: msgpack bytes, decoded by the proxy's parser."""
    reg = protocol.parse_registration(protocol.encode_frame(payload))
    assert reg is not None
    return reg


# -- told its engines ---------------------------------------------------------------------------


def test_an_expected_engines_own_heartbeat_is_accepted_in_either_generation() -> None:
    assert judge(_frame(protocol.g2_payload(PREFILL)), None, 0, EXPECTED, 64) is None
    assert judge(_frame(protocol.g1_payload(replace(DECODE, generation="G1"), 3)), None, 1, EXPECTED, 64) is None


def test_a_decode_announced_by_anyone_else_is_refused_as_unknown() -> None:
    rogue = Registration("D", "127.0.0.1", 45555, 7301, 7501, 1, 1, "WRITE", "G2")
    verdict = judge(_frame(protocol.g2_payload(rogue)), None, 2, EXPECTED, 64)
    assert verdict is not None and verdict.result == "refused_unknown"
    assert "127.0.0.1:45555" in verdict.reason and "2 engines" in verdict.reason


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"host": "10.9.9.9", "http_host": "10.0.0.7"}, "host"),
        ({"handshake_port": 6399}, "handshake_port"),
        ({"notify_port": 6199}, "notify_port"),
        ({"dp_size": 10**6}, "dp_size"),
        ({"tp_size": 8}, "tp_size"),
        ({"role": "D"}, "role"),
        ({"transfer_mode": "READ"}, "transfer_mode"),
    ],
)
def test_a_listed_address_with_any_other_field_is_a_mismatch_naming_it(change: dict[str, object], field: str) -> None:
    frame = _frame(protocol.g2_payload(replace(PREFILL, **change)))  # type: ignore[arg-type]
    assert frame.http_address == PREFILL.http_address
    verdict = judge(frame, PREFILL, 2, EXPECTED, 64)
    assert verdict is not None and verdict.result == "refused_mismatch"
    assert verdict.reason.count("expected") == 1 and field in verdict.reason


def test_expected_engines_parse_from_their_heartbeat_json_and_refuse_the_rest() -> None:
    assert parse_expected_engine(json.dumps(protocol.g2_payload(PREFILL))) == PREFILL
    for bad in ("{", "[]", '{"type": "X"}', json.dumps({**protocol.g2_payload(PREFILL), "dp_size": 0})):
        with pytest.raises(ValueError, match="--expected-engine"):
            parse_expected_engine(bad)
    with pytest.raises(ValueError, match="twice"):
        gate.expected_by_address([PREFILL, replace(PREFILL, role="D")])


# -- discovery ----------------------------------------------------------------------------------


def test_discovery_bounds_the_sizes_an_instance_may_announce() -> None:
    assert judge(replace(DECODE, dp_size=gate.MAX_DP_SIZE, tp_size=gate.MAX_TP_SIZE), None, 0, None, 64) is None
    for sizes in ({"dp_size": 10**6}, {"tp_size": gate.MAX_TP_SIZE + 1}):
        verdict = judge(replace(DECODE, **sizes), None, 0, None, 64)  # type: ignore[arg-type]
        assert verdict is not None and verdict.result == "refused_bounds" and "at most 64" in verdict.reason


def test_discovery_bounds_the_number_of_instances_but_not_known_ones() -> None:
    verdict = judge(DECODE, None, 64, None, 64)
    assert verdict == Verdict("refused_bounds", "10.0.0.7:40005: already 64 instances (--max-instances)")
    assert judge(replace(DECODE, dp_size=2), DECODE, 64, None, 64) is None  # a known instance may change


def test_discovery_never_lets_a_frame_move_a_known_instances_side_channel_host() -> None:
    moved = replace(PREFILL, host="10.6.6.6", http_host="10.0.0.7")
    assert moved.http_address == PREFILL.http_address
    verdict = judge(moved, PREFILL, 2, None, 64)
    assert verdict is not None and verdict.result == "refused_mismatch" and "'10.6.6.6'" in verdict.reason
    assert judge(replace(PREFILL, handshake_port=6401), PREFILL, 2, None, 64) is None  # a restart with new ports


# -- the registry applies the verdicts ------------------------------------------------------------


def test_a_rogue_frame_changes_nothing_when_the_proxy_knows_its_engines() -> None:
    registry = Registry("disaggregated", "auto", None, [], expected=[PREFILL, DECODE])
    rogue = replace(DECODE, http_port=45555, transfer_mode="READ")
    assert registry.observe(rogue, now=0.0).outcome == "refused_unknown"
    assert registry.instances == {} and registry.transfer_mode is None  # a refused frame sets no mode
    assert registry.observe(PREFILL, now=0.0).outcome == "added"
    assert registry.observe(replace(PREFILL, host="10.6.6.6", http_host="10.0.0.7"), 1.0).outcome == "refused_mismatch"
    assert registry.observe(PREFILL, now=2.0).outcome == "refreshed"  # the liveness signal
    assert registry.instances[PREFILL.http_address].registration == PREFILL
    assert registry.instances[PREFILL.http_address].last_heartbeat == 2.0


def test_an_expected_engine_whose_health_answers_outlives_its_heartbeat_ttl() -> None:
    """A flood can delay an expected engine's heartbeats; its /health is the second liveness signal."""
    registry = Registry("disaggregated", "auto", 30.0, [], expected=[PREFILL, DECODE])
    for engine in (PREFILL, DECODE):
        assert registry.observe(engine, now=0.0).outcome == "added"
        registry.record_health(engine.http_address, ok=True, now=25.0)
    assert [inst.key for inst in registry.live("P", 50.0)] == [PREFILL.http_address]
    assert registry.sweep(now=50.0) == []
    registry.record_health(DECODE.http_address, ok=False, now=52.0)
    registry.record_health(DECODE.http_address, ok=False, now=54.0)
    registry.record_health(PREFILL.http_address, ok=True, now=54.0)
    assert registry.live("D", 54.0) == []  # /health failing: out of rotation at once, as before
    assert [inst.key for inst in registry.sweep(now=55.1)] == [DECODE.http_address]  # and stale: evicted
    assert list(registry.instances) == [PREFILL.http_address]


def test_a_discovered_instance_is_evicted_by_its_heartbeat_ttl_whatever_its_health() -> None:
    registry = Registry("disaggregated", "auto", 30.0, [])
    registry.observe(DECODE, now=0.0)
    registry.record_health(DECODE.http_address, ok=True, now=29.0)
    assert registry.live("D", 30.1) == [] and len(registry.sweep(now=30.1)) == 1


def test_static_engines_make_every_frame_unknown() -> None:
    from pd_runtime.proxy.registry import static_engine

    registry = Registry("colocated", "auto", None, [static_engine("http://127.0.0.1:9000")])
    assert registry.observe(DECODE, now=0.0).outcome == "refused_unknown"
    assert list(registry.instances) == ["127.0.0.1:9000"]


def test_new_instances_are_rate_limited_but_heartbeats_of_known_ones_never() -> None:
    registry = Registry("disaggregated", "write", None, [], max_instances=1000)
    frames = [replace(DECODE, http_port=30000 + i) for i in range(40)]
    outcomes = [registry.observe(f, now=0.0).outcome for f in frames]
    assert outcomes.count("added") == gate.NEW_INSTANCES_BURST
    assert outcomes.count("rate_limited") == 40 - gate.NEW_INSTANCES_BURST
    assert all(registry.observe(f, now=0.0).outcome == "refreshed" for f in frames[: gate.NEW_INSTANCES_BURST])
    later = [registry.observe(f, now=1.0).outcome for f in frames[gate.NEW_INSTANCES_BURST :]]
    assert later.count("added") == gate.NEW_INSTANCES_PER_S


def test_five_thousand_distinct_frames_leave_a_bounded_registry_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry("disaggregated", "write", None, [])
    caplog.set_level("WARNING", logger="pd_runtime.proxy.registry")
    # 5,000 frames in 5 s of virtual time: the burst, then 4 a second get in; later the cap of 64 holds
    outcomes = [registry.observe(replace(DECODE, http_port=20000 + i), now=i / 1000).outcome for i in range(5000)]
    assert outcomes.count("added") == len(registry.instances) == gate.NEW_INSTANCES_BURST + int(4.999 * 4)
    assert len(caplog.records) == 1  # the first refusal, at once; the rest wait for the interval
    late = [registry.observe(replace(DECODE, http_port=40000 + i), now=10.0 + i / 10).outcome for i in range(100)]
    assert len(registry.instances) == gate.DEFAULT_MAX_INSTANCES and "refused_bounds" in late
    assert len(caplog.records) == 2 and "rate_limited x" in caplog.records[-1].getMessage()


# -- buckets and summaries ------------------------------------------------------------------------


def test_token_bucket_takes_and_reserves_in_virtual_time() -> None:
    bucket = TokenBucket(rate=2.0, burst=2)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)
    frames = TokenBucket(rate=10.0, burst=1)
    assert frames.reserve(0.0) == 0.0
    assert frames.reserve(0.0) == pytest.approx(0.1) and frames.reserve(0.0) == pytest.approx(0.2)
    assert frames.reserve(10.0) == 0.0  # refilled, capped at the burst


def test_refusal_summary_logs_once_per_interval_with_counts_and_the_last_reason() -> None:
    summary = RefusalSummary(interval_s=10.0)
    assert summary.due(0.0) is None
    summary.add(Verdict("refused_unknown", "a"))
    assert summary.due(0.0) == "refused_unknown x1 (last: a)"
    for reason in ("b", "c"):
        summary.add(Verdict("refused_unknown", reason))
    summary.add(Verdict("rate_limited", "d"))
    assert summary.due(9.9) is None
    assert summary.due(10.0) == "rate_limited x1 (last: d); refused_unknown x2 (last: c)"
    assert summary.due(30.0) is None  # nothing refused since
