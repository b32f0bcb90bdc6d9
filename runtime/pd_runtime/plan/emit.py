"""The PDDeployment for a planned layout, as YAML that `pdctl render` and `kubectl apply` accept.

The runtime never imports the operator's API models (the layer contract), so the manifest is built
here as plain data in the API's field names, and checked against the real API in tests. The API runs
one or two colocated engines, or one prefill and one decode engine; layouts with more engines per role
(4xTP2, xPyD) wait for the multi-instance API (issue 14 builds on the scale-out issue).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pd_runtime.plan.layouts import COLOCATED_ENGINE, DISAGGREGATED_ENGINE, Layout
from pd_runtime.plan.price import Demand

API_VERSION = "pd.serving.dev/v1alpha1"
COLOCATED_PORTS = (8100, 8200)
RDMA_RESOURCE = "rdma/hca_shared_devices_a"
"""The examples' RDMA device plugin resource; the emitted file's header says to check it."""


def supported(layout: Layout) -> bool:
    """Whether today's PDDeployment API can express the layout."""
    if layout.kind == "colocated":
        return layout.engines <= len(COLOCATED_PORTS)
    return layout.prefills == 1 and layout.decodes == 1


def manifest(layout: Layout, model: str, demand: Demand, name: str | None = None) -> dict[str, Any]:
    if not supported(layout):
        raise ValueError(f"layout {layout.name} needs several engines per role, which the PDDeployment API lacks")
    spec: dict[str, Any] = {"model": model, "engine": "vllm", "mode": layout.kind}
    if layout.kind == "colocated":
        spec["colocated"] = {
            "engines": [
                {
                    "gpus": _gpus(i * layout.engine_tp, layout.engine_tp),
                    "port": COLOCATED_PORTS[i],
                    "tensorParallelSize": layout.engine_tp,
                    "enableExpertParallel": True,
                    "maxNumBatchedTokens": COLOCATED_ENGINE["max_batched_tokens"],
                }
                for i in range(layout.engines)
            ]
        }
    else:
        spec["prefill"] = _role(0, layout.prefill_tp)
        spec["decode"] = _role(layout.prefill_tp, layout.decode_tp)
        spec["kvTransfer"] = {"transferMode": "write", "backend": layout.backend}
        if layout.backend == "rdma":
            # the seed's single-node setup: RoCE through the NIC, GIDs in the host network namespace
            spec["kvTransfer"]["rdma"] = {"resourceName": RDMA_RESOURCE, "resourceCount": 1, "hostNetwork": True}
        else:
            # XGMI between the two engines needs both to see every GPU of the node (docs/gpu-allocation.md)
            spec["gpuAllocation"] = {"strategy": "hostDevices"}
    spec["goodputProbe"] = {
        "enabled": True,
        "rate": demand.rate,
        "requests": demand.requests,
        "promptTokens": demand.prompt_tokens,
        "outputTokens": demand.output_tokens,
        "slo": {"ttftMs": round(demand.ttft_slo_s * 1000), "itlMs": round(demand.itl_slo_s * 1000)},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "PDDeployment",
        "metadata": {"name": name or default_name(model, layout)},
        "spec": spec,
    }


def default_name(model: str, layout: Layout) -> str:
    base = f"{model.split('/')[-1]}-{layout.name}".lower()
    return re.sub(r"[^a-z0-9]+", "-", base).strip("-")[:63].rstrip("-")


def to_yaml(data: Any, indent: int = 0) -> str:
    """Block-style YAML of nested dicts, lists and scalars (strings JSON-quoted, which YAML reads as is)."""
    pad = " " * indent
    if isinstance(data, dict):
        lines = []
        for key, value in data.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{key}:\n{to_yaml(value, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
        return "\n".join(lines)
    if isinstance(data, list):
        items = []
        for value in data:
            body = to_yaml(value, indent + 2) if isinstance(value, (dict, list)) else f"{pad}  {_scalar(value)}"
            items.append(f"{pad}- {body.lstrip()}")
        return "\n".join(items)
    return pad + _scalar(data)


def _scalar(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)


def _role(first_gpu: int, tp: int) -> dict[str, Any]:
    return {
        "gpus": _gpus(first_gpu, tp),
        "tensorParallelSize": tp,
        "enableExpertParallel": True,
        "maxNumBatchedTokens": DISAGGREGATED_ENGINE["max_batched_tokens"],
        "maxNumSeqs": DISAGGREGATED_ENGINE["max_num_seqs"],
    }


def _gpus(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)
