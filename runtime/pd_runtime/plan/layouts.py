"""The layouts one node can run, whether the model fits each, and the simulator topology of each.

A layout uses every GPU of the node: colocated N x TPt (round robin over N mixed engines), or
disaggregated xP TPa + yD TPb (write mode, each side in round robin). Engine flags are the seed's:
colocated engines with a budget of 8192 tokens and vLLM's default max_num_seqs, prefill and decode
engines with 4096 tokens and max_num_seqs 64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pd_runtime.plan.catalog import GpuSpec, ModelSpec
from pd_runtime.sim.system import EngineShape, Topology

TP_SIZES = (1, 2, 4, 8)
GPU_MEMORY_UTILIZATION = 0.9
COLOCATED_ENGINE = dict(max_batched_tokens=8192, max_num_seqs=1024)
DISAGGREGATED_ENGINE = dict(max_batched_tokens=4096, max_num_seqs=64)


@dataclass(frozen=True)
class NodeLayout:
    """One way to split a node's GPUs into engines: N colocated engines of one TP size, or xP + yD."""

    kind: Literal["colocated", "disaggregated"]
    prefills: int = 0
    prefill_tp: int = 0
    decodes: int = 0
    decode_tp: int = 0
    engines: int = 0
    engine_tp: int = 0
    backend: Literal["rdma", "xgmi"] = "rdma"

    @property
    def gpus(self) -> int:
        if self.kind == "colocated":
            return self.engines * self.engine_tp
        return self.prefills * self.prefill_tp + self.decodes * self.decode_tp

    @property
    def name(self) -> str:
        if self.kind == "colocated":
            return f"{self.engines}xTP{self.engine_tp}"
        return f"{self.prefills}P TP{self.prefill_tp} + {self.decodes}D TP{self.decode_tp}"

    @property
    def instances(self) -> list[tuple[str, int, EngineShape]]:
        """(role, TP, engine shape) of every engine."""
        if self.kind == "colocated":
            return [("colocated", self.engine_tp, EngineShape(tp=self.engine_tp, **COLOCATED_ENGINE))] * self.engines
        prefill = [("prefill", self.prefill_tp, EngineShape(tp=self.prefill_tp, **DISAGGREGATED_ENGINE))]
        decode = [("decode", self.decode_tp, EngineShape(tp=self.decode_tp, **DISAGGREGATED_ENGINE))]
        return prefill * self.prefills + decode * self.decodes

    def topology(self) -> Topology:
        if self.kind == "colocated":
            return Topology("colocated", engines=self.engines, engine=self.instances[0][2])
        return Topology(
            "write",
            prefill=self.instances[0][2],
            decode=self.instances[-1][2],
            prefills=self.prefills,
            decodes=self.decodes,
            backend=self.backend,
        )

    def predicted(self, model: ModelSpec) -> bool:
        """Timing comes from the TP scaling model, not from a TP size the profile was calibrated at."""
        return any(tp not in model.measured_tp for _, tp, _ in self.instances)


def layouts(gpus: int, backend: Literal["rdma", "xgmi"] = "rdma", mixed_tp: bool = True) -> list[NodeLayout]:
    """Every homogeneous colocated and every xPyD layout that uses exactly ``gpus`` GPUs; ``mixed_tp``: also
    those whose prefill and decode TP differ, which write mode moves KV between from vLLM 0.33 on
    (``vllm_releases.Release.heterogeneous_tp_write``; TP 1, 2, 4, 8 are all multiples of each other)."""
    found = [NodeLayout("colocated", engines=gpus // tp, engine_tp=tp) for tp in TP_SIZES if gpus % tp == 0]
    for a in TP_SIZES:
        for b in TP_SIZES if mixed_tp else (a,):
            for x in range(1, gpus // a + 1):
                rest = gpus - x * a
                if rest > 0 and rest % b == 0:
                    found.append(NodeLayout("disaggregated", x, a, rest // b, b, backend=backend))
    return found


@dataclass(frozen=True)
class Fit:
    """Whether one engine of a layout holds the model and the KV its sequences need, per GPU."""

    role: str
    tp: int
    weights_gb: float
    kv_capacity_tokens: int
    kv_needed_tokens: int

    @property
    def fits(self) -> bool:
        return self.kv_capacity_tokens >= self.kv_needed_tokens


def memory_fit(
    model: ModelSpec, gpu: GpuSpec, layout: NodeLayout, sequences: int, prompt_tokens: int, output_tokens: int
) -> list[Fit]:
    """Per distinct engine: weights per GPU and KV capacity (tokens) against what its sequences need.

    ``sequences`` is how many requests may be in flight at once (capped by each engine's max_num_seqs);
    a prefill engine holds each prompt's KV until it is sent, the others prompt and output.
    """
    fits: dict[tuple[str, int], Fit] = {}
    for role, tp, shape in layout.instances:
        weights = model.weights_bytes / tp
        free = gpu.memory_bytes * GPU_MEMORY_UTILIZATION - weights - gpu.runtime_reserve_bytes
        capacity = max(0, int(free // model.kv_bytes_per_token_per_gpu(tp)))
        per_sequence = prompt_tokens + (1 if role == "prefill" else output_tokens)
        needed = min(sequences, shape.max_num_seqs) * per_sequence
        fits[(role, tp)] = Fit(role, tp, round(weights / 1e9, 1), capacity, needed)
    return list(fits.values())
