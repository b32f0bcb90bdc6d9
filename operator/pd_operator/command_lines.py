"""Pure: a PDDeployment spec -> the exact command lines and environment of each container.

The engine command follows the seed experiment's appendix flag for flag (and its spellings, e.g.
``--gpu_memory_utilization``), wrapped by the launcher: ``pdctl engine <preflight flags> -- vllm serve
...``. The simulated engine receives the very same arguments; only the executable after ``--``
changes. Everything is visible in the pod spec, except the proxy's routing and timeouts: they live in a
ConfigMap the proxy re-reads, so changing them restarts nothing (``proxy_settings``).

The advertised address is the pod IP, passed as ``$(POD_IP)`` inside the kv-transfer config, which
the kubelet expands from the container's ``POD_IP`` variable (a downward-API fieldRef).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pd_operator.api.engines import ColocatedEngineSpec, DisaggregatedRoleSpec, EngineSettings
from pd_operator.api.placement import PROXY_SETTINGS_DIR
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.rules import gpu_indices
from pd_operator.vllm_flags import sets_compilation_config
from pd_runtime import protocol
from pd_runtime.vllm_pin import DEFAULT_MAX_NUM_SEQS

EngineRoleName = Literal["prefill", "decode", "engine"]
EnvEntry = dict[str, Any]

PROXY_IP = "127.0.0.1"  # the proxy's registration socket binds loopback; engines dial it there
# With hostNetwork the pod's loopback is the node's: the engines' HTTP servers listen there only, and the
# proxy (same pod) dials them there (its --engine-host); their KV side channels stay on the node's address.
LOOPBACK = "127.0.0.1"
# Read mode on a kv_consumer: the connector's per-layer wait for KV reads returns at once inside a full
# CUDA graph, so decode could attend to blocks not yet read (vLLM 0.29 warns and asks for PIECEWISE).
READ_MODE_COMPILATION_CONFIG = {"cudagraph_mode": "PIECEWISE"}
POD_IP_REF = "$(POD_IP)"
PROXY_API_KEY_ENV = "PD_PROXY_API_KEY"
# The proxy's settings file: the operator's ConfigMap, mounted as a directory (PROXY_SETTINGS_DIR) so
# updates reach it.
PROXY_SETTINGS_KEY = "proxy.json"
PROXY_SETTINGS_FILE = f"{PROXY_SETTINGS_DIR}/{PROXY_SETTINGS_KEY}"
BENCH_API_KEY_ENV = "PDCTL_BENCH_API_KEY"
DRAIN_DELAY_S = 5.0
"""How long a deleted replica's proxy keeps serving while the Service and the routers drop it (the
EndpointSlice update reaches them well within it), at most a quarter of the termination grace period."""
TERMINATION_LOG = "/dev/termination-log"


@dataclass(frozen=True)
class EngineContainer:
    """One engine container of the pod, with its resolved ports (handshake/notify bases only with a connector)."""

    name: str
    role: EngineRoleName
    settings: EngineSettings
    gpu_range: str  # this engine's GPUs: the role's gpus, or one of its instances'
    http_port: int
    handshake_port: int | None = None
    notify_port: int | None = None

    @property
    def gpus(self) -> list[int]:
        return gpu_indices(self.gpu_range)

    @property
    def named_ports(self) -> list[tuple[str, int]]:
        """Every port the engine listens on: http, then each rank's handshake and notify listener."""
        named = [("http", self.http_port)]
        for name, base in (("handshake", self.handshake_port), ("notify", self.notify_port)):
            if base is not None:
                span = self.settings.rank_port_span
                named += [(name if rank == 0 else f"{name}-{rank}", base + rank) for rank in range(span)]
        return named

    @property
    def ports(self) -> list[int]:
        return [port for _, port in self.named_ports]


def engine_containers(spec: PDDeploymentSpec) -> list[EngineContainer]:
    """The engines of the pod: prefill then decode (one container per instance: prefill or prefill-0,
    prefill-1, ...), or engine-0 [, engine-1] in colocated mode."""
    if not spec.disaggregated:
        return [_colocated(i, e) for i, e in enumerate(spec.colocated.engines)]
    return _role_containers("prefill", spec.prefill) + _role_containers("decode", spec.decode)


def _role_containers(role: Literal["prefill", "decode"], settings: DisaggregatedRoleSpec) -> list[EngineContainer]:
    engines = settings.engine_instances()
    names = [role] if not settings.instances else [f"{role}-{i}" for i in range(len(engines))]
    return [
        EngineContainer(name, role, settings, gpus, ports.http, ports.handshake, ports.notify)
        for name, (gpus, ports) in zip(names, engines, strict=True)
    ]


def _colocated(index: int, engine: ColocatedEngineSpec) -> EngineContainer:
    return EngineContainer(f"engine-{index}", "engine", engine, engine.gpus, engine.port)


# ---- vllm serve ------------------------------------------------------------------------------------


def kv_transfer_config(spec: PDDeploymentSpec, eng: EngineContainer) -> dict[str, Any]:
    """``--kv-transfer-config`` of a prefill (kv_producer) or decode (kv_consumer) engine.

    Port values are strings, as in the seed's appendix (vLLM calls int() on them). Every key of the
    extra config is one vLLM 0.29's MoRI-IO connector reads (``MoRIIOConfig.from_vllm_config``,
    ``get_moriio_mode``, ``resolve_host_ip``); ``read_mode`` is how 0.29 learns the transfer mode.
    """
    kv = spec.kv_transfer
    extra: dict[str, Any] = {
        "proxy_ip": PROXY_IP,
        "proxy_ping_port": str(spec.proxy.registration_port),
        "http_port": str(eng.http_port),
        "handshake_port": str(eng.handshake_port),
        "notify_port": str(eng.notify_port),
        "host_ip": POD_IP_REF,
        "backend": kv.backend,
        "transfer_timeout": kv.transfer_timeout_seconds,
        "defer_timeout": kv.defer_timeout_seconds,
    }
    if kv.transfer_mode == "read":
        extra["read_mode"] = True
    return {
        "kv_connector": kv.connector,
        "kv_role": "kv_producer" if eng.role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": extra,
    }


def vllm_serve_args(spec: PDDeploymentSpec, eng: EngineContainer) -> list[str]:
    """The arguments after ``vllm serve`` (the model first), in the seed appendix's order."""
    s = eng.settings
    args = [spec.model, "-tp", str(s.tensor_parallel_size)]
    if s.data_parallel_size > 1:
        args += ["--data-parallel-size", str(s.data_parallel_size)]
    if s.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    args += ["--port", str(eng.http_port)]
    if spec.host_network:
        args += ["--host", LOOPBACK]
    if spec.served_model_name:
        args += ["--served-model-name", spec.served_model_name]
    if s.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    args += ["--distributed-executor-backend", "mp", "--gpu_memory_utilization", _number(s.gpu_memory_utilization)]
    if s.max_model_len is not None:
        args += ["--max-model-len", str(s.max_model_len)]
    if s.max_num_seqs is not None:
        args += ["--max_num_seqs", str(s.max_num_seqs)]
    args.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    if eng.role != "engine":
        config = kv_transfer_config(spec, eng)
        args += ["--kv-transfer-config", _json(config)]
    if _needs_piecewise_graphs(spec, eng) and not sets_compilation_config(s.extra_args):
        args += ["--compilation-config", _json(READ_MODE_COMPILATION_CONFIG)]
    return args + list(s.extra_args)


def _needs_piecewise_graphs(spec: PDDeploymentSpec, eng: EngineContainer) -> bool:
    """Only the reading side waits for KV per layer; the producer returns before that wait."""
    return eng.role == "decode" and spec.kv_transfer.transfer_mode == "read"


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _number(value: float) -> str:
    return f"{value:g}"


def _launcher_args(spec: PDDeploymentSpec, eng: EngineContainer) -> list[str]:
    real = spec.engine == "vllm"
    backend = spec.kv_transfer.backend if real and eng.role != "engine" else "none"
    gpus = len(eng.gpus) if real else 0
    ports = ",".join(str(p) for p in eng.ports)
    return ["pdctl", "engine", "--role", eng.role, "--gpus", str(gpus), "--backend", backend, "--ports", ports]


def engine_command(spec: PDDeploymentSpec, eng: EngineContainer) -> list[str]:
    """The full container command: launcher preflight, ``--``, then vllm (or the simulated engine)."""
    serve = vllm_serve_args(spec, eng)
    if spec.engine == "vllm":
        executable = ["vllm", "serve", *serve]
    else:
        sim = spec.simulation
        executable = ["pdctl", "sim-engine", *serve, "--profile", sim.profile, "--time-scale", _number(sim.time_scale)]
    return [*_launcher_args(spec, eng), "--", *executable]


# ---- environment ------------------------------------------------------------------------------------


def _literal(name: str, value: str) -> EnvEntry:
    return {"name": name, "value": value}


def _field_ref(name: str, path: str) -> EnvEntry:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _secret_ref(name: str, secret: str, key: str) -> EnvEntry:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def engine_env(spec: PDDeploymentSpec, eng: EngineContainer) -> list[EnvEntry]:
    """Environment of an engine container, in the seed appendix's order, then the user's entries.

    A user entry with the name of an operator entry replaces its value in place (one entry per name).
    """
    disaggregated = eng.role != "engine"
    kv = spec.kv_transfer
    # The seed's VLLM_MORIIO_CONNECTOR_READ_MODE=1 is not rendered: vLLM 0.29 ignores it (and warns that
    # it is deprecated); read mode travels as read_mode in the kv-transfer config.
    env: list[EnvEntry] = [_literal("VLLM_ROCM_USE_AITER", "1")]
    if spec.gpu_allocation.strategy == "hostDevices":
        visible = ",".join(str(i) for i in eng.gpus)
        env += [_literal("CUDA_VISIBLE_DEVICES", visible), _literal("HIP_VISIBLE_DEVICES", visible)]
    if disaggregated:
        # Both are no-ops with the pinned vLLM 0.29 and its MoRI, kept because the seed sets them:
        # MoRI creates an XGMI backend by itself only when MORI_DISABLE_AUTO_XGMI is "0", and vLLM
        # already creates the RDMA backend with enable_notification=False (the variable would force it off).
        if kv.backend == "rdma":
            env.append(_literal("MORI_DISABLE_AUTO_XGMI", "1"))
        env.append(_literal("MORI_IO_ENABLE_NOTIFICATION", "0"))
    env += [
        _field_ref("POD_IP", "status.podIP"),
        _field_ref("VLLM_HOST_IP", "status.podIP"),
        _literal("VLLM_ENGINE_READY_TIMEOUT_S", str(spec.model_storage.load_timeout_seconds)),
    ]
    storage = spec.model_storage
    if storage.persistent_volume_claim or storage.host_path:
        env.append(_literal("HF_HOME", storage.mount_path))
    if storage.hub_token_secret:
        env.append(_secret_ref("HF_TOKEN", storage.hub_token_secret.name, storage.hub_token_secret.key))
    env += [_literal(name, value) for name, value in cache_dirs(spec, eng).items()]
    return _merge_env(env, [_literal(e.name, e.value) for e in eng.settings.env])


def cache_dirs(spec: PDDeploymentSpec, eng: EngineContainer) -> dict[str, str]:
    """The compile and JIT caches of one engine, under its own directory of the cache volume.

    Without them vLLM (``VLLM_CACHE_ROOT``, default ~/.cache/vllm: torch.compile output with its Inductor
    and Triton caches), Triton (``TRITON_CACHE_DIR``, default ~/.triton/cache), MoRI (``MORI_JIT_CACHE_DIR``)
    and AITER (``AITER_JIT_DIR``, default its package directory) write into the container's writable layer
    and rebuild everything after each restart. One directory per engine: the two engines never write the
    same files at once. AITER's modules are compiled against the image, so their directory is per image;
    with ``AITER_JIT_DIR`` set AITER imports modules from there only, and the launcher links the image's
    prebuilt ones in before the engine starts (``pd_runtime.aiter_cache``).
    """
    root = f"{spec.cache_storage.mount_path.rstrip('/')}/{eng.name}"
    image = hashlib.sha256(spec.image.encode()).hexdigest()[:12]
    return {
        "VLLM_CACHE_ROOT": f"{root}/vllm",
        "TRITON_CACHE_DIR": f"{root}/triton",
        "MORI_JIT_CACHE_DIR": f"{root}/mori",
        "AITER_JIT_DIR": f"{root}/aiter-{image}",
    }


def _merge_env(base: list[EnvEntry], overrides: list[EnvEntry]) -> list[EnvEntry]:
    by_name = {e["name"]: e for e in overrides}
    merged = [by_name.pop(e["name"], e) for e in base]
    return merged + [e for e in overrides if e["name"] in by_name]


# ---- proxy and probe --------------------------------------------------------------------------------


def proxy_command(spec: PDDeploymentSpec) -> list[str]:
    """``pdctl proxy``: API on all addresses, registration on loopback, admin on its own port.

    Routing and timeouts are not here but in the settings file (``proxy_settings``), so a change of them
    reaches the running proxy without a new pod; what stays here needs a restart or is fixed by the
    engines' own settings, which roll the pod anyway.
    """
    p = spec.proxy
    cmd = [
        "pdctl",
        "proxy",
        "--host",
        "0.0.0.0",
        "--port",
        str(p.port),
        "--registration-address",
        f"tcp://{PROXY_IP}:{p.registration_port}",
        "--mode",
        spec.mode,
    ]
    if spec.disaggregated:
        cmd += ["--transfer-mode", spec.kv_transfer.transfer_mode]
        if spec.host_network:
            cmd += ["--engine-host", LOOPBACK]
    else:
        for eng in engine_containers(spec):
            cmd += ["--engine", f"http://127.0.0.1:{eng.http_port}"]
    cmd += ["--admin-port", str(p.admin_port), "--config-file", PROXY_SETTINGS_FILE]
    cmd += ["--drain-delay", _number(drain_delay(spec)), "--drain-timeout", _number(drain_timeout(spec))]
    if spec.disaggregated and p.canary_interval_seconds:
        cmd += ["--canary-interval", _number(p.canary_interval_seconds)]
    if p.heartbeat_ttl_seconds is not None:
        cmd += ["--heartbeat-ttl", _number(p.heartbeat_ttl_seconds)]
    if p.otlp_traces_endpoint:
        cmd += ["--otlp-traces-endpoint", p.otlp_traces_endpoint]
    for eng in engine_containers(spec) if spec.disaggregated else []:
        cmd += ["--expected-engine", expected_heartbeat(spec, eng)]
    if spec.mode == "disaggregated":
        # Fixed by the engines' settings: the longest wait for KV before prefill has dropped it (a settings
        # file asking for more is refused), and no more requests per decode rank than it runs at once
        # (vLLM's default max_num_seqs when unset).
        limit = _number(spec.proxy_kv_wait_limit())
        max_num_seqs = spec.decode.max_num_seqs or DEFAULT_MAX_NUM_SEQS
        cmd += ["--kv-wait-timeout", limit, "--kv-wait-limit", limit, "--decode-max-in-flight", str(max_num_seqs)]
    return cmd + list(p.extra_args)


def drain_delay(spec: PDDeploymentSpec) -> float:
    """On deletion the proxy answers /ready 503 but serves on for this long, so no request is refused."""
    return min(DRAIN_DELAY_S, spec.termination_grace_period_seconds / 4)


def drain_timeout(spec: PDDeploymentSpec) -> float:
    """Then in-flight streams may finish for the rest of the grace period (less a second for the exit)."""
    return max(0.0, spec.termination_grace_period_seconds - drain_delay(spec) - 1)


def engine_pre_stop_command(spec: PDDeploymentSpec) -> list[str]:
    """The engines' preStop hook: the kubelet SIGTERMs every container at once, so each engine waits
    first until the pod's proxy has drained (its admin port, closed last, stops listening), for at most
    the proxy's own drain bound; the requests the proxy still relays then find their engines serving."""
    bound = drain_delay(spec) + drain_timeout(spec)
    return ["pdctl", "wait-proxy-gone", "--port", str(spec.proxy.admin_port), "--timeout", _number(bound)]


def expected_heartbeat(spec: PDDeploymentSpec, eng: EngineContainer) -> str:
    """The heartbeat this engine sends the proxy (vLLM's G2 frame, built from its own kv-transfer config:
    ``host_ip`` is the pod IP, ``http_port``, the base handshake and notify ports, DP and TP sizes), for
    ``--expected-engine``: the proxy refuses every frame that is not one of these. In the command line,
    not the settings file: it changes only with the engines' own command lines, which roll the pod, and
    the kubelet expands ``$(POD_IP)`` in commands only."""
    assert eng.handshake_port is not None and eng.notify_port is not None, "an engine with a KV connector"
    s = eng.settings
    heartbeat = protocol.Registration(
        role="P" if eng.role == "prefill" else "D",
        host=POD_IP_REF,
        http_port=eng.http_port,
        handshake_port=eng.handshake_port,
        notify_port=eng.notify_port,
        dp_size=s.data_parallel_size,
        tp_size=s.tensor_parallel_size,
        transfer_mode="READ" if spec.kv_transfer.transfer_mode == "read" else "WRITE",
        generation="G2",
    )
    return _json(protocol.g2_payload(heartbeat))


def proxy_settings(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The proxy's reloadable settings, keyed by flag name without dashes (``pd_runtime.proxy.reload``).

    The operator renders them into the ConfigMap the proxy container mounts; the proxy applies a changed
    file while it runs, so neither engine restarts. Unset timeouts and admission limit are left out: the
    proxy's defaults apply.
    """
    p = spec.proxy
    settings: dict[str, Any] = {"policy": p.policy}
    timeouts = {
        "connect-timeout": p.timeouts.connect_seconds,
        "prefill-timeout": p.timeouts.prefill_seconds,
        "first-byte-timeout": p.timeouts.decode_first_byte_seconds,
        "idle-timeout": p.timeouts.idle_seconds,
        "response-timeout": p.timeouts.response_seconds,
    }
    settings |= {key: value for key, value in timeouts.items() if value is not None}
    if p.policy == "prefix_affinity":
        settings |= {
            "affinity-prefix-tokens": p.prefix_affinity.prefix_tokens,
            "affinity-max-imbalance": p.prefix_affinity.max_imbalance,
        }
    if p.admission.max_in_flight:  # unset: the flags' values (no limit, or extraArgs' --max-in-flight)
        settings |= {
            "max-in-flight": p.admission.max_in_flight,
            "max-queued": p.admission.max_queued,
            "queue-timeout": p.admission.queue_timeout_seconds,
        }
    if spec.disaggregated:
        chosen = p.timeouts.kv_wait_seconds  # unset: as long as decode can still get its KV
        settings |= {
            "kv-wait-timeout": spec.proxy_kv_wait_limit() if chosen is None else chosen,
            "no-kv-fallback": p.no_kv_fallback,
            "on-kv-mismatch": p.on_kv_mismatch,
        }
    return settings


def proxy_env(spec: PDDeploymentSpec) -> list[EnvEntry]:
    """The client key, and the pod IP the engines advertise (the kubelet puts it in ``--expected-engine``)."""
    secret = spec.proxy.api_key_secret
    env = [_secret_ref(PROXY_API_KEY_ENV, secret.name, secret.key)] if secret else []
    return env + ([_field_ref("POD_IP", "status.podIP")] if spec.disaggregated else [])


def bench_command(spec: PDDeploymentSpec, url: str) -> list[str]:
    """The goodput probe: ``pdctl bench`` writing its summary where the kubelet reads termination messages."""
    g = spec.goodput_probe
    cmd = [
        "pdctl",
        "bench",
        "--url",
        url,
        "--model",
        spec.served_name,
        "--rate",
        _number(g.rate),
        "--requests",
        str(g.requests),
        "--prompt-tokens",
        str(g.prompt_tokens),
        "--output-tokens",
        str(g.output_tokens),
        "--slo-ttft-ms",
        _number(g.slo.ttft_ms),
        "--slo-itl-ms",
        _number(g.slo.itl_ms),
        "--target",
        _number(g.slo.target),
    ]
    if g.search:
        cmd.append("--search")
    if not g.ignore_eos:
        cmd.append("--no-ignore-eos")
    if g.seed is not None:
        cmd += ["--seed", str(g.seed)]
    return [*cmd, "--quiet", "--result-file", TERMINATION_LOG]


def bench_env(spec: PDDeploymentSpec) -> list[EnvEntry]:
    secret = spec.proxy.api_key_secret
    return [_secret_ref(BENCH_API_KEY_ENV, secret.name, secret.key)] if secret else []
