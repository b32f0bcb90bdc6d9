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


def kv_transfer_time(profile: Profile, tokens: int) -> float:
    """A whole transfer of ``tokens`` tokens' KV (read mode: D pulls after prefill ended)."""
    if profile.kv_link_bytes_per_s <= 0:
        return profile.kv_transfer_latency_s
    return profile.kv_transfer_latency_s + tokens * profile.kv_bytes_per_token / profile.kv_link_bytes_per_s


def write_tail_time(profile: Profile, tokens: int, prefill_duration: float) -> float:
    """Write mode: P pushes each layer as it is computed, so after prefill ends only the part of the
    transfer that did not fit under the prefill remains (at least the last layer's share)."""
    whole = kv_transfer_time(profile, tokens) - profile.kv_transfer_latency_s
    last_layer = whole / max(profile.num_layers, 1)
    return profile.kv_transfer_latency_s + max(last_layer, whole - prefill_duration)
