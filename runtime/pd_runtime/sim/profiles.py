"""Named timing profiles: the parameters of the step-cost model in ``timing``.

All durations are model seconds at the profile's reference tensor-parallel size; ``timing`` scales them
to an engine's actual TP. The equations and how ``qwen3-235b-mi300x`` was calibrated are in
docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    reference_tp: int = 4
    tp_exponent: float = 0.85
    """Speed-up of TP=n over the reference is (n/reference_tp) ** tp_exponent (communication eats the rest)."""
    step_overhead_s: float = 0.0
    """Scheduling, sampling, kernel launches: paid by every step whatever its size (not TP-scaled)."""
    prefill_step_overhead_s: float = 0.0
    """Extra cost of a step that carries a prefill chunk: such steps cannot replay the captured decode
    graph and run their attention kernels eagerly (not TP-scaled)."""
    weights_read_s: float = 0.0
    """Streaming the active weights from HBM once: the floor of a decode step (bandwidth-bound)."""
    token_compute_s: float = 0.0
    """GEMM time per scheduled token (compute-bound); a step costs max(weights_read, tokens * this)."""
    kv_read_s_per_token: float = 0.0
    """Attention's KV reads per token of context of each decoding sequence (grows with batch and context)."""
    attention_s_per_token_pair: float = 0.0
    """Prefill attention: per (new token x context token) pair, the quadratic part of a long prompt."""
    num_layers: int = 1
    """Write mode overlaps the transfer with prefill layer by layer: only the last layer's share adds."""
    kv_heads: int = 0
    """KV heads per layer (0: no KV to move, the transfer costs only its latency)."""
    head_dim: int = 128
    kv_dtype_bytes: int = 2
    """Bytes per KV element: 2 for BF16 (vLLM's `auto` KV dtype for an FP8 checkpoint), 1 for FP8."""
    block_tokens: int = 16
    """Tokens per KV-cache block: one RDMA message carries one block of one layer's K or V."""
    rdma_line_bytes_per_s: float = 48.9e9
    """One 400 Gb/s NIC's RDMA payload rate for large messages."""
    rdma_message_overhead_s: float = 0.226e-6
    """Per-message cost on a NIC. With the line rate above it reproduces MoRI-IO's measured RDMA READ
    throughput on MI300X: 48.4 GB/s at 1 MiB messages and 20.8 GB/s at 8 KiB (ROCm/mori README)."""
    xgmi_bytes_per_s: float = 64e9
    """One XGMI link, per direction (MI300X: every GPU pair of the node has one)."""
    kv_transfer_latency_s: float = 0.0
    """Fixed cost of one transfer (RDMA post, completion, notify round trip)."""
    proxy_hop_s: float = 0.0
    """One proxy -> engine hop (HTTP parse, routing); the read-mode serialisation pays it twice."""
    eos_mean_tokens: float = 0.0
    """Without ignore_eos, outputs stop at EOS after a geometric number of tokens with this mean (0 = never)."""

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers (Qwen3-235B: 94 x 4 heads x 128 x K,V x 2 B = 188 KiB)."""
        return self.num_layers * self.kv_heads * self.head_dim * 2 * self.kv_dtype_bytes


INSTANT = Profile(name="instant")

# Qwen3-235B-A22B-FP8 on MI300X, per TP4 instance; calibrated against the seed article (docs/simulator.md).
QWEN3_235B_MI300X = Profile(
    name="qwen3-235b-mi300x",
    reference_tp=4,
    tp_exponent=0.7,
    step_overhead_s=0.006,
    prefill_step_overhead_s=0.16,
    weights_read_s=0.021,
    token_compute_s=20e-6,
    kv_read_s_per_token=130e-9,
    attention_s_per_token_pair=2e-9,
    num_layers=94,
    kv_heads=4,
    head_dim=128,
    kv_dtype_bytes=2,
    kv_transfer_latency_s=0.004,
    proxy_hop_s=0.002,
    eos_mean_tokens=100.0,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (INSTANT, QWEN3_235B_MI300X)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
