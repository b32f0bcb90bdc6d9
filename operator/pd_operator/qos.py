"""Pure: CPU and memory of every container of the serving pod, so that it is never BestEffort.

Extended resources (GPUs, NICs) do not count for the QoS class: without CPU and memory requests the
pod is BestEffort, the first evicted under memory pressure, and its memory-backed /dev/shm (32 GiB per
engine by default) is memory the scheduler never sees. So every engine requests CPU and memory by
default, its memory request covering its /dev/shm plus a margin; the user's ``resources`` win key by
key. ``qosClass: Guaranteed`` sets the CPU and memory limits of every container to its requests.
docs/gpu-allocation.md ("CPU and memory") states the values and why.
"""

from __future__ import annotations

from collections.abc import Mapping

from pd_operator import quantity
from pd_operator.api import EngineSettings, PDDeploymentSpec

# An 8x MI300X host has 2 x 96-core EPYCs (192 CPUs) and 2 TiB of memory or more: two engines of four
# GPUs with these requests take a sixth of its CPUs and a tenth of its memory.
ENGINE_CPU_PER_GPU = 4  # one vLLM worker process per GPU, plus the API server, engine core, tokenizer
ENGINE_MEMORY_MARGIN_PER_GPU = "16Gi"  # each worker's host memory (ROCm, torch, staging) beyond /dev/shm
SIMULATED_ENGINE_CPU = "250m"
SIMULATED_ENGINE_MEMORY_MARGIN = "512Mi"
PROXY_REQUESTS = {"cpu": "500m", "memory": "256Mi"}
PROXY_LIMITS = {"cpu": "2", "memory": "1Gi"}
COMPUTE = ("cpu", "memory")

Quantities = dict[str, str]


def _requests(defaults: Mapping[str, str], requests: Mapping[str, str], limits: Mapping[str, str]) -> Quantities:
    """The user's requests over the defaults; a default never exceeds a limit the user set (as Kubernetes
    itself defaults a missing request to the limit)."""
    fitted = {k: (quantity.smaller(v, limits[k]) if k in limits else v) for k, v in defaults.items()}
    return {**fitted, **requests}


def _limits(spec: PDDeploymentSpec, requests: Mapping[str, str], limits: Mapping[str, str]) -> Quantities:
    if spec.qos_class == "Guaranteed":
        return {**limits, **{k: requests[k] for k in COMPUTE}}
    return dict(limits)


def engine_default_requests(spec: PDDeploymentSpec, settings: EngineSettings, gpus: int) -> Quantities:
    """What an engine requests when its ``resources`` say nothing: memory = /dev/shm + margin."""
    if spec.engine == "vllm":
        cpu, margin = str(ENGINE_CPU_PER_GPU * gpus), quantity.parse(ENGINE_MEMORY_MARGIN_PER_GPU) * gpus
    else:
        cpu, margin = SIMULATED_ENGINE_CPU, quantity.parse(SIMULATED_ENGINE_MEMORY_MARGIN)
    return {"cpu": cpu, "memory": quantity.format_bytes(quantity.parse(settings.shm_size) + margin)}


def engine(spec: PDDeploymentSpec, settings: EngineSettings, gpus: int) -> tuple[Quantities, Quantities]:
    """(requests, limits) of CPU and memory of one engine container (GPU and NIC limits come on top)."""
    res = settings.resources
    requests = _requests(engine_default_requests(spec, settings, gpus), res.requests, res.limits)
    return requests, _limits(spec, requests, res.limits)


def proxy(spec: PDDeploymentSpec) -> tuple[Quantities, Quantities]:
    """(requests, limits) of the proxy: small, and bounded (default limits never below the requests)."""
    res = spec.proxy.resources
    requests = _requests(PROXY_REQUESTS, res.requests, res.limits)
    default_limits = {k: quantity.larger(v, requests[k]) for k, v in PROXY_LIMITS.items()}
    return requests, _limits(spec, requests, {**default_limits, **res.limits})
