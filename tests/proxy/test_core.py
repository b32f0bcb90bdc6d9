"""Unit tests of the pure core: routing, registry rules, legs and id rewriting (no I/O)."""

from __future__ import annotations

from collections import Counter

import pytest

from pd_runtime.protocol import Registration
from pd_runtime.proxy.errors import ApiError
from pd_runtime.proxy.legs import decode_token_limits, parse_client_request
from pd_runtime.proxy.registry import Registry, static_engine
from pd_runtime.proxy.relay import IdRewriter
from pd_runtime.proxy.routing import (
    Candidate,
    Policy,
    Router,
    decode_dp_rank,
    interleaved_slots,
    least_outstanding,
    round_robin,
)


def _reg(role: str = "P", port: int = 20005, mode: str = "WRITE", dp: int = 1, generation: str = "G2") -> Registration:
    return Registration(
        role=role,  # type: ignore[arg-type]
        host="10.0.0.1",
        http_port=port,
        handshake_port=6301,
        notify_port=6105,
        dp_size=dp,
        tp_size=4,
        transfer_mode=mode,  # type: ignore[arg-type]
        generation=generation,  # type: ignore[arg-type]
    )


# -- routing ------------------------------------------------------------------------------------


def test_slots_interleave_ranks_across_instances_of_different_dp_sizes() -> None:
    slots = interleaved_slots([Candidate("a", 2), Candidate("b", 1), Candidate("c", 3)])
    assert slots == [
        ("a", 0), ("b", None), ("c", 0), ("a", 1), ("c", 1), ("c", 2),
    ]  # fmt: skip


def test_round_robin_visits_every_slot_once_per_cycle() -> None:
    candidates = [Candidate("a", 2), Candidate("b", 2)]
    picks = [round_robin(interleaved_slots(candidates), n) for n in range(8)]
    assert picks[:4] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert picks[4:] == picks[:4]


def test_least_outstanding_prefers_idle_slots_and_rotates_ties() -> None:
    candidates = [Candidate("a", 1), Candidate("b", 1), Candidate("c", 1)]
    busy = {("a", None): 3, ("b", None): 1}
    slots = interleaved_slots(candidates)
    assert least_outstanding(slots, busy, 0) == ("c", None)
    assert [least_outstanding(slots, {}, n)[0] for n in range(3)] == ["a", "b", "c"]


def test_decode_rank_matches_prefill_only_when_sizes_match() -> None:
    assert decode_dp_rank(3, 8, 1, 8) == 3
    assert decode_dp_rank(3, 8, 0, 2) == 0  # P is DP8, D is DP2: D's own rank, never out of range
    assert decode_dp_rank(3, 8, None, 1) is None


def test_router_counts_outstanding_per_slot() -> None:
    router = Router("least_outstanding")
    candidates = [Candidate("a", 1), Candidate("b", 1)]
    first = router.pick("P", candidates)
    router.acquire(first)
    assert router.pick("P", candidates) != first
    router.release(first)
    assert router.outstanding(first) == 0


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_load"])
def test_router_skips_slots_at_their_limit_and_reports_saturation(policy: Policy) -> None:
    """Per decode DP rank at most ``limit`` requests (the engine's max_num_seqs), whatever the policy."""
    router = Router(policy)
    candidates = [Candidate("a", 2), Candidate("b", 1)]
    picked = []
    for _ in range(6):
        slot = router.pick("D", candidates, limit=2)
        assert slot is not None
        router.acquire(slot)
        picked.append(slot)
    assert sorted(Counter(picked).values()) == [2, 2, 2]
    assert router.pick("D", candidates, limit=2) is None
    router.release(picked[0])
    assert router.pick("D", candidates, limit=2) == picked[0]
    assert router.pick("D", candidates) is not None  # no limit


# -- registry -----------------------------------------------------------------------------------


def test_registry_upserts_refreshes_and_evicts_after_the_ttl() -> None:
    registry = Registry("disaggregated", "auto", None, [])
    assert registry.observe(_reg(), now=0.0).outcome == "added"
    assert registry.observe(_reg(), now=2.0).outcome == "refreshed"
    # 10 x the G2 interval: vLLM < 0.32 beats from a thread inside the GPU worker, which misses beats
    # during long steps; 9 s (3 beats) evicted busy engines.
    assert registry.ttl(registry.instances["10.0.0.1:20005"]) == 30.0
    assert registry.sweep(now=31.9) == []
    assert [inst.key for inst in registry.sweep(now=32.1)] == ["10.0.0.1:20005"]
    assert registry.transfer_mode is None  # every registered instance gone: auto mode resets


def test_g1_instances_get_a_longer_default_ttl() -> None:
    registry = Registry("disaggregated", "auto", None, [])
    registry.observe(_reg(generation="G1"), now=0.0)
    assert registry.ttl(registry.instances["10.0.0.1:20005"]) == 50.0


def test_transfer_mode_conflicts_refuse_only_the_conflicting_instance() -> None:
    registry = Registry("disaggregated", "read", 5.0, [])
    refused = registry.observe(_reg(mode="WRITE"), now=0.0)
    assert refused.outcome == "refused_mismatch" and "WRITE" in refused.reason
    assert registry.observe(_reg("D", 40005, mode="READ"), now=0.0).outcome == "added"
    assert list(registry.instances) == ["10.0.0.1:40005"]


def test_auto_mode_follows_the_first_registration() -> None:
    registry = Registry("disaggregated", "auto", 5.0, [])
    registry.observe(_reg(mode="READ"), now=0.0)
    assert registry.transfer_mode == "READ"
    assert registry.observe(_reg("D", 40005, mode="WRITE"), now=0.0).outcome == "refused_mismatch"


def test_health_failures_need_two_in_a_row_and_one_success_heals() -> None:
    registry = Registry("disaggregated", "auto", 5.0, [])
    registry.observe(_reg(), now=0.0)
    assert registry.live("P", 0.0) == []  # not routable before its first successful probe
    registry.record_health("10.0.0.1:20005", ok=True, now=0.0)
    registry.record_health("10.0.0.1:20005", ok=False, now=0.0)
    assert len(registry.live("P", 0.0)) == 1
    registry.record_health("10.0.0.1:20005", ok=False, now=0.0)
    assert registry.live("P", 0.0) == []
    registry.record_health("10.0.0.1:20005", ok=True, now=0.0)
    assert len(registry.live("P", 0.0)) == 1


def test_engine_host_dials_engines_on_loopback_and_keeps_their_side_channel_host() -> None:
    """hostNetwork: the engines' HTTP servers listen on 127.0.0.1, their registrations carry the node's
    address (their KV side channels listen there for the peer engine)."""
    registry = Registry("disaggregated", "auto", None, [], engine_host="127.0.0.1")
    assert registry.observe(_reg(), now=0.0).outcome == "added"
    assert registry.observe(_reg(), now=1.0).outcome == "refreshed"
    (inst,) = registry.instances.values()
    assert inst.key == "10.0.0.1:20005", "keyed, gated and listed by what the engine registered"
    assert inst.http_host == "127.0.0.1" and inst.base_url == "http://127.0.0.1:20005"
    assert inst.registration.zmq_address.startswith("host:10.0.0.1,") and inst.last_heartbeat == 1.0


def test_static_engines_never_expire_and_cannot_be_hijacked() -> None:
    engine = static_engine("http://127.0.0.1:9000/")
    registry = Registry("colocated", "auto", 1.0, [engine])
    assert registry.sweep(now=1e9) == []
    hijack = Registration("P", "127.0.0.1", 9000, 1, 2, 1, 1, "WRITE", "G2")
    assert registry.observe(hijack, now=0.0).outcome == "refused_unknown"
    with pytest.raises(ValueError):
        static_engine("https://x:1")


# -- legs ---------------------------------------------------------------------------------------


def test_client_transfer_fields_are_stripped() -> None:
    raw = b'{"prompt": "x", "kv_transfer_params": {"a": 1}, "request_id": "r"}'
    request = parse_client_request(raw, "completions", "disaggregated", 100)
    assert request.body == {"prompt": "x"}


def test_a_one_element_prompt_list_is_one_prompt() -> None:
    parse_client_request(b'{"prompt": ["only one"]}', "completions", "disaggregated", 100)
    parse_client_request(b'{"prompt": [[1, 2]]}', "completions", "disaggregated", 100)
    parse_client_request(b'{"prompt": ["a", "b"], "n": 3}', "completions", "colocated", 100)
    with pytest.raises(ApiError):
        parse_client_request(b'{"prompt": [1, "a"]}', "completions", "colocated", 100)


def test_token_limit_policies() -> None:
    body = {"max_tokens": 5, "max_completion_tokens": 1}
    assert decode_token_limits(body, "exact") == body
    assert decode_token_limits(body, "decrement") == {"max_tokens": 4, "max_completion_tokens": 1}
    assert decode_token_limits({}, "decrement") == {}
    assert decode_token_limits({"max_tokens": None}, "decrement") == {"max_tokens": None}


def test_id_rewriter_handles_ids_split_across_reads() -> None:
    internal = (
        "___prefill_addr_host:10.0.0.1,handshake:1,notify:2___decode_addr_host:10.0.0.2,handshake:3,notify:4_"
        + "a" * 32
    )
    rewriter = IdRewriter(internal, "a" * 32)
    event = f'data: {{"id":"cmpl-{internal}-0-1234"}}\n\n'.encode()
    out = rewriter.feed(event[:40]) + rewriter.feed(event[40:] + event[:10]) + rewriter.feed(event[10:])
    out += rewriter.flush()
    assert out == 2 * f'data: {{"id":"cmpl-{"a" * 32}-0-1234"}}\n\n'.encode()
    assert rewriter.whole(event) == out[: len(out) // 2]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_a_400_before_any_engine(token: str) -> None:
    """Python's json reads NaN and Infinity; engines would get non-JSON tokens (issue 19)."""
    with pytest.raises(ApiError) as refused:
        parse_client_request(b'{"prompt": "x", "temperature": %s}' % token.encode(), "completions", "colocated", 100)
    assert refused.value.status == 400 and refused.value.code == "invalid_json" and token in refused.value.message
