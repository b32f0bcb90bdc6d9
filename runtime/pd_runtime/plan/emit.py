"""The PDDeployment for a planned layout, as YAML that `pdctl render` and `kubectl apply` accept.

The runtime never imports the operator's API models (the layer contract), so the manifest is built
here as plain data in the API's field names, and checked against the real API in tests. The API runs
one or two colocated engines, and any number of prefill and decode instances (``instances``, xPyD in
one pod); 4xTP2 colocated would need four colocated engines, which it does not run.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pd_runtime.plan.layouts import COLOCATED_ENGINE, DISAGGREGATED_ENGINE, NodeLayout
from pd_runtime.plan.price import Demand
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

API_VERSION = "pd.serving.dev/v1alpha1"
COLOCATED_PORTS = (8100, 8200)
RDMA_RESOURCE = "rdma/hca_shared_devices_a"
"""The examples' RDMA device plugin resource; the emitted file's header says to check it."""


PREFILL_PORTS = {"http": 20005, "handshake": 6301, "notify": 6105}
DECODE_PORTS = {"http": 40005, "handshake": 7301, "notify": 7501}
INSTANCE_PORT_STRIDE = {"http": 1, "handshake": 10, "notify": 10}
"""Instance i's base ports: side channels 10 apart, room for the rank offsets of up to TP8."""


def supported(layout: NodeLayout) -> bool:
    """Whether today's PDDeployment API can express the layout."""
    if layout.kind == "colocated":
        return layout.engines <= len(COLOCATED_PORTS)
    return True


def manifest(
    layout: NodeLayout, model: str, demand: Demand, name: str | None = None, vllm_version: str = PINNED_VLLM_VERSION
) -> dict[str, Any]:
    """``vllm_version``: the release the layout was planned for, declared as ``engineVersion`` when the layout
    needs it (prefill and decode TP differ: vLLM 0.33 or later)."""
    if not supported(layout):
        raise ValueError(f"layout {layout.name} needs {layout.engines} colocated engines; the API runs one or two")
    spec: dict[str, Any] = {"model": model, "engine": "vllm", "mode": layout.kind}
    if layout.kind == "disaggregated" and layout.prefill_tp != layout.decode_tp:
        spec["engineVersion"] = vllm_version
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
        decode_first = layout.prefills * layout.prefill_tp
        spec["prefill"] = _role(0, layout.prefill_tp, layout.prefills, PREFILL_PORTS)
        spec["decode"] = _role(decode_first, layout.decode_tp, layout.decodes, DECODE_PORTS)
        spec["kvTransfer"] = {"transferMode": "write", "backend": layout.backend}
        if layout.backend == "rdma":
            # the seed's single-node setup: RoCE through the NIC, GIDs in the host network namespace, which
            # the chart's tenancy policy admits only with policy.allowHostNetwork
            spec["kvTransfer"]["rdma"] = {"resourceName": RDMA_RESOURCE, "resourceCount": 1, "hostNetwork": True}
        else:
            # XGMI between the two engines needs both to see every GPU of the node (docs/gpu-allocation.md):
            # privileged engines, which the chart's tenancy policy admits only with policy.allowPrivileged
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


def default_name(model: str, layout: NodeLayout) -> str:
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


def _role(first_gpu: int, tp: int, count: int, ports: dict[str, int]) -> dict[str, Any]:
    role: dict[str, Any] = {
        "tensorParallelSize": tp,
        "enableExpertParallel": True,
        "maxNumBatchedTokens": DISAGGREGATED_ENGINE["max_batched_tokens"],
        "maxNumSeqs": DISAGGREGATED_ENGINE["max_num_seqs"],
    }
    if count == 1:
        return {"gpus": _gpus(first_gpu, tp), **role, "ports": dict(ports)}
    role["instances"] = [
        {
            "gpus": _gpus(first_gpu + i * tp, tp),
            "ports": {name: base + i * INSTANCE_PORT_STRIDE[name] for name, base in ports.items()},
        }
        for i in range(count)
    ]
    return role


def _gpus(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)
