"""Pure: the `pdctl sim-engine MODEL [vllm serve arguments...]` command line -> an EngineConfig.

The simulator accepts the exact argv the operator renders for `vllm serve`, so swapping the executable
is the only difference between a real and a simulated pod. vLLM spells flags ``--a-b`` and ``--a_b``
interchangeably and accepts ``--flag=value``; both are normalised first. Flags that change nothing in
the simulation are accepted and reported back so the CLI can log them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pd_runtime import protocol
from pd_runtime.sim.versions import MORIIO_METRICS_FLAG, VERSION_ENV, VERSION_FLAG, simulated_version
from pd_runtime.vllm_pin import DEFAULT_MAX_NUM_SEQS, PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import release

# vLLM V1's defaults for the OpenAI server on GPUs with >= 70 GiB (MI300X): see docs/simulator.md.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_MODEL_LEN = 32768
# docs/protocol.md#rank-ports `_set_port_defaults`.
DEFAULT_HANDSHAKE_PORT = 6301
DEFAULT_NOTIFY_PORT = 61005

LoadFailurePolicy = Literal["fail", "recompute"]
ExecutorBackend = Literal["mp", "uni", "ray", "external_launcher"]
ENV_PREFIX = "PD_SIM_"
READ_MODE_ENV = "VLLM_MORIIO_CONNECTOR_READ_MODE"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's --api-key when the flag is not given


class ConfigError(ValueError):
    """A command line the simulator cannot run with (the CLI exits 2 with this message)."""


@dataclass(frozen=True)
class ConnectorConfig:
    """The MoRIIOConnector part of --kv-transfer-config (docs/protocol.md#extra-config)."""

    role: protocol.Role
    read_mode: bool
    host_ip: str
    proxy_ip: str
    proxy_ping_port: int
    http_port: int
    handshake_port: int
    notify_port: int
    transfer_timeout_s: float
    defer_timeout_s: float
    load_failure_policy: LoadFailurePolicy = "fail"
    """``kv_load_failure_policy`` (a KVTransferConfig key, not an extra one): what decode does with a request
    whose KV cannot load: fail it, or compute it whole itself."""

    @property
    def transfer_mode(self) -> protocol.TransferMode:
        return "READ" if self.read_mode else "WRITE"


@dataclass(frozen=True)
class Faults:
    """Failure knobs for testing the proxy and the operator (flags, or PD_SIM_<NAME> in the environment)."""

    no_register: bool = False
    unresponsive: bool = False
    """Register (heartbeats keep flowing) but never answer HTTP: a hung engine."""
    first_byte_delay_s: float = 0.0
    prefill_error: int = 0
    """HTTP status returned to every producer (P-leg) request instead of serving it; 0 = off."""
    eos_first_token: bool = False
    """Every prompt's first token is EOS, on every leg (P and D agree), unless ``min_tokens`` masks it as vLLM
    does: a producer without min_tokens answers finish_reason stop, no kv_transfer_params
    (docs/protocol.md#prefill-answer); with the proxy's ``min_tokens: 1`` decode samples the EOS itself."""
    drop_notify: float = 0.0
    """Fraction of incoming notify messages silently dropped."""
    crash_after: int = 0
    """Exit abruptly after this many finished requests; 0 = never."""
    corrupt_kv: bool = False
    """KV this engine receives as a decode engine arrives corrupted: its greedy tokens differ from the ones
    the prompt gives (what a byte mover writing the wrong bytes does; the transfer itself succeeds)."""
    kv_fault_file: str = ""
    """A fault switch read at every KV transfer, the live tier's ``mori.io`` stand-in's format
    (``{"fault": "corrupt"|"drop"|"delay"|"fail", "seconds": S}``; connector.py says what each does)."""
    kv_transfer_log: str = ""
    """Where every KV transfer is appended, one JSON line (``op``, ``transfer_id``, ``fault``)."""


@dataclass(frozen=True)
class EngineConfig:
    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    tp: int
    dp: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    chunked_prefill: bool
    connector: ConnectorConfig | None
    profile: str
    time_scale: float
    registration: protocol.Generation
    request_id_suffix: bool
    require_transfer_id: bool
    faults: Faults
    vllm_version: str = PINNED_VLLM_VERSION
    """The vLLM release whose connector behaviours the engine reproduces (sim/versions.py)."""
    kv_blocks: int | None = None
    """KV-cache blocks per DP rank (--num-gpu-blocks-override); None: never full, no preemption."""
    prefix_cache_blocks: int = 0
    """Prompt blocks each DP rank's prefix cache keeps (--sim-prefix-cache-blocks); 0: no prefix caching."""
    moriio_metrics: bool = False
    """Export vLLM main's ``vllm:moriio_*`` transfer metrics (--sim-moriio-metrics); no release has them."""
    ignored_flags: tuple[str, ...] = field(default=())
    api_keys: tuple[str, ...] = ()
    """Keys one of which /v1 requires as a bearer token (vLLM's --api-key, else VLLM_API_KEY); none: open."""
    executor_backend: ExecutorBackend = "uni"
    """vLLM's --distributed-executor-backend, defaulted as vLLM does: ``mp`` past one worker, else ``uni``."""

    @property
    def reap_waits_for_a_forward_step(self) -> bool:
        """Whether an expired deferred send keeps its blocks until the engine's next forward step (docs/
        vllm-versions.md#deferred-send-reaping): vLLM reaps it in the scheduler's ``update_connector_output``,
        which an idle step reaches only through the multiprocess executors' KV output aggregator."""
        return self.executor_backend in ("uni", "external_launcher")


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """``--a_b=v`` -> ``--a-b``, ``v``: one spelling per flag before argparse sees it."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg.partition("=")
            out.append(name.replace("_", "-"))
            if sep:
                out.append(value)
        else:
            out.append(arg)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl sim-engine",
        description="Simulated vLLM engine: OpenAI API, MoRI-IO protocol, prefill/decode timing model.",
        allow_abbrev=False,
    )
    vllm = parser.add_argument_group("vllm serve arguments (others are accepted and ignored)")
    vllm.add_argument("--model", dest="model_flag")
    vllm.add_argument("--served-model-name", nargs="+")
    vllm.add_argument("--host", default="0.0.0.0")
    vllm.add_argument("--port", type=int, default=8000)
    vllm.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1)
    vllm.add_argument("-dp", "--data-parallel-size", dest="dp", type=int, default=1)
    vllm.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    vllm.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    vllm.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    vllm.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    vllm.add_argument("--kv-transfer-config")
    vllm.add_argument("--num-gpu-blocks-override", type=int, default=None)
    vllm.add_argument("--distributed-executor-backend", choices=get_args(ExecutorBackend), default=None)
    vllm.add_argument("--api-key", nargs="+", default=None)
    sim = parser.add_argument_group("simulator")
    sim.add_argument("--profile", default="instant", help="timing profile: instant, qwen3-235b-mi300x")
    sim.add_argument("--time-scale", type=float, default=1.0, help="run modelled durations X times faster")
    sim.add_argument("--sim-registration", choices=("g1", "g2"), default=None, help="heartbeat format")
    sim.add_argument("--sim-request-id-suffix", action=argparse.BooleanOptionalAction, default=None)
    sim.add_argument("--sim-require-transfer-id", action=argparse.BooleanOptionalAction, default=None)
    sim.add_argument(
        "--sim-prefix-cache-blocks",
        type=int,
        default=0,
        metavar="BLOCKS",
        help="model vLLM's prefix caching: each DP rank keeps the KV of this many 16-token prompt blocks "
        "(least recently used out) and computes only a prompt's uncached rest; 0: off (the default)",
    )
    sim.add_argument(
        MORIIO_METRICS_FLAG,
        action=argparse.BooleanOptionalAction,
        default=None,
        help="export the vllm:moriio_* transfer metrics of vLLM's main branch, which no release (through 0.34) "
        "has; off by default, as every release",
    )
    sim.add_argument(
        VERSION_FLAG,
        default=None,
        help=f"reproduce this vLLM release's connector behaviours (default {PINNED_VLLM_VERSION}, the image's; "
        f"also {VERSION_ENV})",
    )
    faults = parser.add_argument_group("fault knobs (also PD_SIM_<NAME>, e.g. PD_SIM_CRASH_AFTER=10)")
    faults.add_argument("--sim-no-register", action="store_true", default=None)
    faults.add_argument("--sim-unresponsive", action="store_true", default=None)
    faults.add_argument("--sim-first-byte-delay", type=float, default=None, metavar="SECONDS")
    faults.add_argument("--sim-prefill-error", type=int, default=None, metavar="STATUS")
    faults.add_argument("--sim-eos-first-token", action="store_true", default=None)
    faults.add_argument("--sim-drop-notify", type=float, default=None, metavar="FRACTION")
    faults.add_argument("--sim-crash-after", type=int, default=None, metavar="N")
    faults.add_argument("--sim-corrupt-kv", action="store_true", default=None)
    faults.add_argument("--sim-kv-fault-file", default=None, metavar="PATH")
    faults.add_argument("--sim-kv-transfer-log", default=None, metavar="PATH")
    return parser


def _env_value(env: Mapping[str, str], flag: str, value: Any, kind: type) -> Any:
    """A flag left unset falls back to PD_SIM_<NAME>; then to the kind's zero."""
    if value is not None:
        return value
    raw = env.get(ENV_PREFIX + flag.upper().replace("-", "_"))
    if raw is None or raw == "":
        return None
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{flag.upper().replace('-', '_')}={raw!r} is not a {kind.__name__}") from None


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> EngineConfig:
    env = os.environ if env is None else env
    args = normalise_argv(argv)
    model = args.pop(0) if args and not args[0].startswith("-") else None
    parser = build_parser()
    ns, unknown = parser.parse_known_args(args)
    model = model or ns.model_flag
    if not model:
        raise ConfigError("a MODEL is required: pdctl sim-engine MODEL [vllm serve arguments...]")
    _check_positive(ns)
    connector = _connector(ns.kv_transfer_config, ns.port, env) if ns.kv_transfer_config else None

    def knob(name: str, kind: type, default: Any) -> Any:
        value = _env_value(env, name, getattr(ns, "sim_" + name.replace("-", "_")), kind)
        return default if value is None else value

    faults = Faults(
        no_register=knob("no-register", bool, False),
        unresponsive=knob("unresponsive", bool, False),
        first_byte_delay_s=knob("first-byte-delay", float, 0.0),
        prefill_error=knob("prefill-error", int, 0),
        eos_first_token=knob("eos-first-token", bool, False),
        drop_notify=knob("drop-notify", float, 0.0),
        crash_after=knob("crash-after", int, 0),
        corrupt_kv=knob("corrupt-kv", bool, False),
        kv_fault_file=knob("kv-fault-file", str, ""),
        kv_transfer_log=knob("kv-transfer-log", str, ""),
    )
    if faults.prefill_error and not 400 <= faults.prefill_error <= 599:
        raise ConfigError(f"--sim-prefill-error must be an HTTP error status (400-599), got {faults.prefill_error}")
    if not 0.0 <= faults.drop_notify <= 1.0:
        raise ConfigError(f"--sim-drop-notify is a fraction in [0, 1], got {faults.drop_notify}")
    registration: protocol.Generation = "G1" if knob("registration", str, "g2").lower() == "g1" else "G2"
    vllm_version = simulated_version(args, env)
    try:
        release(vllm_version)
    except ValueError as exc:
        raise ConfigError(f"--vllm-version: {exc}") from None
    if ns.num_gpu_blocks_override is not None and ns.num_gpu_blocks_override < 1:
        raise ConfigError("--num-gpu-blocks-override must be at least 1")
    if ns.sim_prefix_cache_blocks < 0:
        raise ConfigError("--sim-prefix-cache-blocks must be 0 (off) or more")
    return EngineConfig(
        model=model,
        served_model_names=tuple(ns.served_model_name or [model]),
        host=ns.host,
        port=ns.port,
        tp=ns.tp,
        dp=ns.dp,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        max_num_seqs=ns.max_num_seqs,
        max_model_len=ns.max_model_len,
        chunked_prefill=ns.enable_chunked_prefill,
        connector=connector,
        profile=ns.profile,
        time_scale=ns.time_scale,
        registration=registration,
        request_id_suffix=knob("request-id-suffix", bool, True),
        require_transfer_id=knob("require-transfer-id", bool, True),
        faults=faults,
        vllm_version=vllm_version,
        kv_blocks=ns.num_gpu_blocks_override,
        prefix_cache_blocks=ns.sim_prefix_cache_blocks,
        moriio_metrics=knob("moriio-metrics", bool, False),
        ignored_flags=tuple(unknown),
        api_keys=tuple(key for key in (ns.api_key or [env.get(API_KEY_ENV, "")]) if key),
        executor_backend=ns.distributed_executor_backend or ("mp" if ns.tp * ns.dp > 1 else "uni"),
    )


def _check_positive(ns: argparse.Namespace) -> None:
    for name in ("tp", "dp", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
        if getattr(ns, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if ns.time_scale <= 0:
        raise ConfigError("--time-scale must be positive")
    if not 0 < ns.port < 65536:
        raise ConfigError(f"--port {ns.port} is out of range")


def _connector(raw: str, port: int, env: Mapping[str, str]) -> ConnectorConfig:
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kv-transfer-config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError("--kv-transfer-config must be a JSON object")
    roles: dict[str, protocol.Role] = {"kv_producer": "P", "kv_consumer": "D"}
    role = roles.get(str(config.get("kv_role")))
    if role is None:
        raise ConfigError(f"kv_role must be kv_producer or kv_consumer, got {config.get('kv_role')!r}")
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("kv_connector_extra_config must be a JSON object")
    policy = config.get("kv_load_failure_policy", "fail")
    if policy not in ("fail", "recompute"):
        raise ConfigError(f"kv_load_failure_policy must be 'recompute' or 'fail', got {policy!r}")
    return ConnectorConfig(
        role=role,
        read_mode=_truthy(extra.get("read_mode")) or _truthy(env.get(READ_MODE_ENV)),
        host_ip=str(extra.get("host_ip") or env.get("VLLM_HOST_IP") or "127.0.0.1"),
        proxy_ip=str(extra.get("proxy_ip") or ""),
        proxy_ping_port=_int(extra, "proxy_ping_port", protocol.REGISTRATION_PORT),
        http_port=_int(extra, "http_port", port),
        handshake_port=_int(extra, "handshake_port", DEFAULT_HANDSHAKE_PORT),
        notify_port=_int(extra, "notify_port", DEFAULT_NOTIFY_PORT),
        transfer_timeout_s=_float(extra, "transfer_timeout", protocol.DEFAULT_TRANSFER_TIMEOUT_S),
        defer_timeout_s=_float(extra, "defer_timeout", protocol.DEFAULT_DEFER_TIMEOUT_S),
        load_failure_policy=policy,
    )


def _truthy(value: Any) -> bool:
    """docs/protocol.md#extra-config: ``"true"``/``"1"`` (any case) selects read mode; JSON true and 1 too."""
    return str(value).strip().lower() in ("true", "1")


def _int(extra: dict[str, Any], key: str, default: int) -> int:
    value = extra.get(key)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"kv_connector_extra_config.{key}={value!r} is not an integer") from None
    if not 0 < number < 65536:
        raise ConfigError(f"kv_connector_extra_config.{key}={number} is not a port")
    return number


def _float(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"kv_connector_extra_config.{key}={value!r} is not a number") from None


Mode = Literal["colocated", "producer", "consumer"]


def engine_mode(config: EngineConfig) -> Mode:
    if config.connector is None:
        return "colocated"
    return "producer" if config.connector.role == "P" else "consumer"
