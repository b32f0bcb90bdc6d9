"""Pure step-cost model: how long one engine step and one KV transfer take.

A step runs every scheduled token through the model at once (continuous batching). Its cost is a
roofline: the active weights are streamed from HBM once per step (bandwidth floor) unless the step has
so many tokens that the GEMMs take longer (compute-bound prefill). On top come attention's KV reads,
which grow with the batch and each sequence's context, and the quadratic attention of prefill chunks.
So a decode-only step is cheap and flat in batch size, while a step that also carries a prefill chunk
costs that chunk's compute: that is the prefill/decode interference of a colocated engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pd_runtime.sim.profiles import Profile


@dataclass(frozen=True)
class BatchShape:
    """What one step computes, reduced to the numbers the cost model needs."""

    tokens: int = 0
    """All scheduled tokens: prefill chunk tokens plus one per decoding sequence."""
    prefill_tokens: int = 0
    """Of ``tokens``, those that belong to prefill chunks."""
    decode_context: int = 0
    """Sum of the context lengths of the sequences that decode one token in this step."""
    prefill_pairs: int = 0
    """Sum over prefill chunks of (chunk tokens x mean context position): quadratic attention work."""


def tp_speedup(profile: Profile, tp: int) -> float:
    """Parallel speed-up of TP=tp relative to the profile's reference TP."""
    return float((tp / profile.reference_tp) ** profile.tp_exponent)


def step_time(profile: Profile, tp: int, shape: BatchShape) -> float:
    """Model seconds one engine step takes; 0 for an empty step."""
    if shape.tokens <= 0:
        return 0.0
    matmul = max(profile.weights_read_s, shape.tokens * profile.token_compute_s)
    attention = shape.decode_context * profile.kv_read_s_per_token
    attention += shape.prefill_pairs * profile.attention_s_per_token_pair
    overhead = profile.step_overhead_s + (profile.prefill_step_overhead_s if shape.prefill_tokens else 0.0)
    return overhead + (matmul + attention) / tp_speedup(profile, tp)


@dataclass(frozen=True)
class KVLink:
    """How one prefill engine's KV reaches one decode engine: the backend and both sides' TP."""

    backend: Literal["rdma", "xgmi"] = "rdma"
    prefill_tp: int = 4
    decode_tp: int = 4


def kv_transfer_time(profile: Profile, tokens: int, link: KVLink = KVLink()) -> float:
    """A whole transfer of ``tokens`` tokens' KV (read mode: D pulls after prefill ended).

    Every decode rank receives the KV heads it serves from the prefill rank that holds them, over its
    own NIC (RDMA) or over the XGMI link of that GPU pair. Each rank sends and receives in parallel, so
    the transfer lasts as long as the busiest rank's link: its bytes at line rate plus, for RDMA, a
    fixed cost per message. A message is one block of one layer's K or V when both sides hold the same
    heads, one token's heads when the TP sizes differ (the heads a rank needs are then strided in the
    sender's block).
    """
    loads = _rank_loads(profile, tokens, link)
    if not loads:
        return profile.kv_transfer_latency_s
    return profile.kv_transfer_latency_s + max(loads.values())


def _heads(rank: int, tp: int, kv_heads: int) -> range:
    """KV heads rank ``rank`` of a TP group holds (replicated when there are more ranks than heads)."""
    if tp <= kv_heads:
        per = kv_heads // tp
        return range(rank * per, (rank + 1) * per)
    head = rank // (tp // kv_heads)
    return range(head, head + 1)


def _rank_loads(profile: Profile, tokens: int, link: KVLink) -> dict[tuple[str, int], float]:
    """Seconds each rank's link is busy, keyed by ("p"|"d", rank) for RDMA, by pair for XGMI."""
    heads = profile.kv_heads
    if tokens <= 0 or heads <= 0:
        return {}
    head_bytes = profile.head_dim * profile.kv_dtype_bytes
    blocks = -(-tokens // profile.block_tokens)
    loads: dict[tuple[str, int], float] = {}
    for d_rank in range(link.decode_tp):
        wanted = _heads(d_rank, link.decode_tp, heads)
        sources = [r for r in range(link.prefill_tp) if set(_heads(r, link.prefill_tp, heads)) & set(wanted)]
        # one replica of each head is enough: spread the decode ranks over the replicas
        by_head: dict[int, int] = {}
        for head in wanted:
            holders = [r for r in sources if head in _heads(r, link.prefill_tp, heads)]
            by_head[head] = holders[d_rank % len(holders)]
        for p_rank in set(by_head.values()):
            count = sum(1 for r in by_head.values() if r == p_rank)
            same = list(_heads(p_rank, link.prefill_tp, heads)) == list(wanted)
            per_layer_kv = 2 * profile.num_layers
            messages = per_layer_kv * (blocks if same else tokens)
            size = tokens * per_layer_kv * count * head_bytes
            if link.backend == "xgmi":
                key = ("pair", p_rank * 1000 + d_rank)
                loads[key] = loads.get(key, 0.0) + size / profile.xgmi_bytes_per_s
            else:
                busy = size / profile.rdma_line_bytes_per_s + messages * profile.rdma_message_overhead_s
                for key in (("p", p_rank), ("d", d_rank)):
                    loads[key] = loads.get(key, 0.0) + busy
    return loads


def write_tail_time(profile: Profile, tokens: int, prefill_duration: float, link: KVLink = KVLink()) -> float:
    """Write mode: P pushes each layer as it is computed, so after prefill ends only the part of the
    transfer that did not fit under the prefill remains (at least the last layer's share)."""
    whole = kv_transfer_time(profile, tokens, link) - profile.kv_transfer_latency_s
    last_layer = whole / max(profile.num_layers, 1)
    return profile.kv_transfer_latency_s + max(last_layer, whole - prefill_duration)
