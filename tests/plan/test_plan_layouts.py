"""Which layouts one node has, which of them hold Qwen3-235B-A22B-FP8 on MI300X, which are predicted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pd_runtime.plan.catalog import MI300X, QWEN3_235B_A22B_FP8, get_model
from pd_runtime.plan.layouts import NodeLayout, layouts, memory_fit

M = QWEN3_235B_A22B_FP8


def names(gpus: int = 8) -> set[str]:
    return {layout.name for layout in layouts(gpus)}


def test_every_layout_of_the_issue_is_enumerated() -> None:
    assert {"1xTP8", "2xTP4", "4xTP2", "1P TP4 + 1D TP4", "2P TP2 + 1D TP4", "1P TP4 + 2D TP2"} <= names()
    assert all(layout.gpus == 8 for layout in layouts(8))
    assert "1P TP4 + 1D TP4" not in names(4)  # a layout uses exactly the node's GPUs


def fits(layout: NodeLayout, prompt: int = 2000, output: int = 1000, requests: int = 100) -> bool:
    return all(f.fits for f in memory_fit(M, MI300X, layout, requests, prompt, output))


def test_tp1_cannot_hold_the_weights_and_tp2_holds_the_seed_workload() -> None:
    assert not fits(NodeLayout("colocated", engines=8, engine_tp=1))
    (tp1,) = memory_fit(M, MI300X, NodeLayout("colocated", engines=8, engine_tp=1), 100, 2000, 1000)
    assert tp1.weights_gb == 236 and tp1.kv_capacity_tokens == 0
    assert fits(NodeLayout("colocated", engines=4, engine_tp=2))
    assert fits(NodeLayout("disaggregated", 2, 2, 1, 4))


def test_kv_capacity_is_computed_from_memory_and_the_kv_geometry() -> None:
    (tp2,) = memory_fit(M, MI300X, NodeLayout("colocated", engines=4, engine_tp=2), 100, 2000, 1000)
    # 0.9 x 192 GB - 118 GB of weights - 8 GB reserve, over 94 layers x 2 heads x 128 x (K,V) x 2 B per token
    assert tp2.kv_capacity_tokens == int((0.9 * 192e9 - 118e9 - 8e9) // (94 * 2 * 128 * 2 * 2))
    assert tp2.kv_needed_tokens == 100 * 3000
    # more ranks than KV heads replicate the heads: TP8 holds one head per GPU, as TP4 does
    assert M.kv_bytes_per_token_per_gpu(8) == M.kv_bytes_per_token_per_gpu(4)


def test_long_contexts_leave_out_the_tp2_engines() -> None:
    # 100 requests of 16k + 1k tokens: a TP2 decode engine (64 sequences) needs 1.09M tokens of KV, holds 0.49M
    assert not fits(NodeLayout("disaggregated", 1, 4, 2, 2), prompt=16000)
    assert fits(NodeLayout("disaggregated", 1, 4, 1, 4), prompt=16000)


def test_fp8_kv_halves_the_bytes_per_token() -> None:
    fp8 = replace(M, profile=replace(M.profile, kv_dtype_bytes=1))
    assert fp8.kv_bytes_per_token_per_gpu(4) * 2 == M.kv_bytes_per_token_per_gpu(4)


def test_predicted_means_a_tp_size_the_profile_was_not_calibrated_at() -> None:
    assert not NodeLayout("colocated", engines=2, engine_tp=4).predicted(M)
    assert not NodeLayout("colocated", engines=1, engine_tp=8).predicted(M)
    assert not NodeLayout("disaggregated", 1, 4, 1, 4).predicted(M)
    assert NodeLayout("disaggregated", 2, 2, 1, 4).predicted(M)
    assert NodeLayout("colocated", engines=4, engine_tp=2).predicted(M)


def test_topology_carries_counts_tp_and_backend() -> None:
    topo = NodeLayout("disaggregated", 2, 2, 1, 4, backend="xgmi").topology()
    assert (topo.kind, topo.prefills, topo.prefill.tp, topo.decodes, topo.decode.tp) == ("write", 2, 2, 1, 4)
    assert topo.kv_link.backend == "xgmi"
    assert topo.prefill.max_batched_tokens == 4096 and topo.decode.max_num_seqs == 64
    colocated = NodeLayout("colocated", engines=2, engine_tp=4).topology()
    assert (colocated.engines, colocated.engine.max_batched_tokens) == (2, 8192)


def test_models_are_found_by_name_and_unknown_ones_are_named() -> None:
    assert get_model("qwen3-235b-a22b-fp8") is M
    with pytest.raises(ValueError, match="--model 'llama'"):
        get_model("llama")
