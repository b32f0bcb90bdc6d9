"""What the planner knows about models and GPUs: sizes that decide whether a layout fits at all.

Numbers are the public ones (model card, checkpoint size, data sheet); the timing of a model comes from
its simulator profile (``pd_runtime.sim.profiles``), calibrated against the seed article.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_runtime.sim.profiles import QWEN3_235B_MI300X, Profile

GB = 10**9


@dataclass(frozen=True)
class ModelSpec:
    name: str
    weights_bytes: int
    """Checkpoint size: what tensor parallelism splits across the GPUs of one instance."""
    profile: Profile
    """Timing and KV geometry (layers, KV heads, head dim, KV dtype)."""
    measured_tp: frozenset[int]
    """TP sizes the profile was calibrated at; others are predicted by its TP scaling model."""

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """One token's KV on one GPU of a TP group: its share of the KV heads (at least one head: with
        more ranks than KV heads, vLLM replicates each head)."""
        p = self.profile
        heads = max(1, p.kv_heads // tp)
        return p.num_layers * heads * p.head_dim * 2 * p.kv_dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    runtime_reserve_bytes: int
    """Per GPU, outside weights and KV: activations at the token budget, graphs, communication buffers."""


QWEN3_235B_A22B_FP8 = ModelSpec(
    name="Qwen/Qwen3-235B-A22B-FP8",
    weights_bytes=236 * GB,  # FP8 experts with block scales, BF16 embeddings and norms (hub checkpoint)
    profile=QWEN3_235B_MI300X,
    measured_tp=frozenset({4, 8}),  # the seed: TP4 prefill/decode/colocated engines and one TP8 engine
)
MI300X = GpuSpec(name="MI300X", memory_bytes=192 * GB, runtime_reserve_bytes=8 * GB)

MODELS: dict[str, ModelSpec] = {QWEN3_235B_A22B_FP8.name: QWEN3_235B_A22B_FP8}


def get_model(name: str) -> ModelSpec:
    """The model by its Hugging Face name (case-insensitive, with or without the organisation)."""
    for spec in MODELS.values():
        if name.lower() in (spec.name.lower(), spec.name.split("/")[-1].lower()):
            return spec
    raise ValueError(f"--model {name!r}: no calibrated profile for it; known: {', '.join(MODELS)}")
