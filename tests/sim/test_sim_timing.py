"""The step-cost model: the properties the seed's argument rests on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pd_runtime.sim.profiles import INSTANT, QWEN3_235B_MI300X, get_profile
from pd_runtime.sim.timing import BatchShape, KVLink, kv_transfer_time, step_time, tp_speedup, write_tail_time

P = QWEN3_235B_MI300X


def decode_step(batch: int, context: int, tp: int = 4) -> float:
    return step_time(P, tp, BatchShape(tokens=batch, decode_context=batch * context))


def prefill_step(tokens: int, tp: int = 4, decodes: int = 0) -> float:
    shape = BatchShape(
        tokens=tokens + decodes,
        prefill_tokens=tokens,
        decode_context=decodes * 2000,
        prefill_pairs=tokens * tokens // 2,
    )
    return step_time(P, tp, shape)


def test_empty_step_costs_nothing() -> None:
    assert step_time(P, 4, BatchShape()) == 0.0


def test_instant_profile_is_instant() -> None:
    assert step_time(INSTANT, 4, BatchShape(tokens=8192, prefill_tokens=8192, prefill_pairs=10**8)) == 0.0
    assert kv_transfer_time(INSTANT, 2000) == 0.0


def test_decode_step_grows_with_batch_and_context() -> None:
    assert decode_step(1, 2000) < decode_step(32, 2000) < decode_step(64, 2000)
    assert decode_step(32, 1000) < decode_step(32, 3000)


def test_decode_is_bandwidth_bound_so_batching_is_cheap() -> None:
    # 64 sequences cost far less than 64 single-sequence steps: weights are read once per step.
    assert decode_step(64, 2000) < 2 * decode_step(1, 2000)


def test_prefill_cost_grows_with_prompt_tokens() -> None:
    assert prefill_step(512) < prefill_step(2000) < prefill_step(4096)
    # compute-bound: past the fixed per-step cost, each extra token costs the same GEMM time (plus attention)
    first, second = prefill_step(2048) - prefill_step(1024), prefill_step(4096) - prefill_step(2048)
    assert 1.8 < second / first < 3.0


def test_prefill_chunk_inflates_a_decode_step() -> None:
    # colocated interference: decodes sharing a step with a 2000-token chunk wait for it
    assert prefill_step(2000, decodes=32) > 4 * decode_step(32, 2000)


def test_seed_scale_itl_and_prefill() -> None:
    # P/D decode at a typical batch sits below the 50 ms ITL SLO (seed: ~37 ms)...
    assert 0.025 < decode_step(40, 2100) < 0.045
    # ...while a step carrying one 2000-token prompt breaks it on its own.
    assert prefill_step(2000, decodes=40) > 0.05


def test_more_tensor_parallelism_is_faster_but_sublinear() -> None:
    assert tp_speedup(P, 4) == pytest.approx(1.0)
    assert 1.0 < tp_speedup(P, 8) < 2.0
    assert prefill_step(2000, tp=8) < prefill_step(2000, tp=4)


def test_kv_bytes_per_token_from_the_model_geometry() -> None:
    # Qwen3-235B-A22B: 94 layers x 4 KV heads x 128 x (K, V): 188 KiB in BF16, 94 KiB in FP8
    assert P.kv_bytes_per_token == 188 * 1024
    assert replace(P, kv_dtype_bytes=1).kv_bytes_per_token == 94 * 1024


def test_rdma_link_reproduces_moriio_measured_throughput() -> None:
    # one rank pair, one layer, one head, one block: message size = block bytes; many messages in a row
    for message, measured in ((1 << 20, 48.4e9), (8 << 10, 20.8e9)):
        per_message = message / P.rdma_line_bytes_per_s + P.rdma_message_overhead_s
        assert message / per_message == pytest.approx(measured, rel=0.01)


def test_kv_transfer_time_from_bytes_and_bandwidth() -> None:
    # TP4 -> TP4 over RDMA: each rank moves one head, 2000 tokens in 125 blocks x 94 layers x (K, V) messages
    per_rank_bytes = 2000 * 94 * 2 * 128 * 2
    messages = 125 * 94 * 2
    expected = per_rank_bytes / P.rdma_line_bytes_per_s + messages * P.rdma_message_overhead_s
    assert kv_transfer_time(P, 2000) == pytest.approx(P.kv_transfer_latency_s + expected)
    # FP8 KV halves the bytes, not the message count
    assert kv_transfer_time(replace(P, kv_dtype_bytes=1), 2000) < kv_transfer_time(P, 2000)


def test_xgmi_is_bandwidth_bound_and_faster_than_rdma() -> None:
    xgmi = kv_transfer_time(P, 2000, KVLink("xgmi", 4, 4))
    assert xgmi == pytest.approx(P.kv_transfer_latency_s + 2000 * 94 * 2 * 128 * 2 / 64e9)
    assert xgmi < kv_transfer_time(P, 2000, KVLink("rdma", 4, 4))


def test_tp_fan_out_is_predicted() -> None:
    same = kv_transfer_time(P, 2000, KVLink("rdma", 4, 4))
    # TP2 -> TP4: each prefill rank feeds two decode ranks through its one NIC, and the heads a decode rank
    # needs are strided in the sender's blocks (one message per token), so the message rate dominates
    assert kv_transfer_time(P, 2000, KVLink("rdma", 2, 4)) > 5 * same
    # TP2 -> TP2: twice the bytes per rank, same message count per rank
    assert same < kv_transfer_time(P, 2000, KVLink("rdma", 2, 2)) < 2 * same
    # TP8 holds each of the 4 heads twice: every decode rank still receives exactly one head
    assert kv_transfer_time(P, 2000, KVLink("rdma", 8, 8)) == pytest.approx(same)


def test_write_mode_overlaps_the_transfer_with_prefill() -> None:
    full = kv_transfer_time(P, 2000)
    tail = write_tail_time(P, 2000, prefill_duration=0.002)
    assert tail < full
    # a link slower than the prefill leaves the uncovered remainder
    assert write_tail_time(P, 2000, 0.002) == pytest.approx(kv_transfer_time(P, 2000) - 0.002)
    last_layer = (full - P.kv_transfer_latency_s) / 94
    assert write_tail_time(P, 2000, 0.2) == pytest.approx(P.kv_transfer_latency_s + last_layer)


def test_unknown_profile_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        get_profile("nope")
