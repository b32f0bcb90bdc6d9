"""The proxy's settings: one frozen value built by the CLI (or by tests), read everywhere else.

Each setting is declared once, here: its default and its help text. ``pdctl proxy`` generates its
flags from these fields (``cli.build_parser``), so a default cannot drift between the two. Fields marked
``reload=True`` may also come from the settings file (``--config-file``, the operator's ConfigMap) and
change while the proxy runs (``reload.py``); the others need a restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from pd_runtime.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from pd_runtime.protocol import (
    DEFAULT_DEFER_TIMEOUT_S,
    DEFAULT_TRANSFER_TIMEOUT_S,
    KV_WAIT_MARGIN_S,
    REGISTRATION_PORT,
)
from pd_runtime.proxy.admin_auth import Network
from pd_runtime.proxy.disaggregation import DisaggregationPolicy
from pd_runtime.proxy.gate import DEFAULT_MAX_INSTANCES
from pd_runtime.proxy.kvcheck import OnKvMismatch
from pd_runtime.proxy.legs import MaxTokensPolicy, ProxyMode
from pd_runtime.proxy.registry import TransferModeSetting
from pd_runtime.proxy.routing import DEFAULT_MAX_IMBALANCE, Policy

NoKvFallback = Literal["prefill", "error"]

# Write mode: prefill drops a transfer when decode's block list comes more than defer_timeout after its
# prefill; an accepted one completes within transfer_timeout. Past their sum decode will never get the KV.
DEFAULT_KV_WAIT_S = DEFAULT_DEFER_TIMEOUT_S + DEFAULT_TRANSFER_TIMEOUT_S + KV_WAIT_MARGIN_S


MIB = 1024 * 1024
TIMEOUT_SUFFIX = "-timeout"  # Timeouts.connect is --connect-timeout


def flag(
    help: str,
    *,
    name: str | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    reload: bool = False,
) -> dict[str, Any]:
    """Field metadata for the setting's ``pdctl proxy`` flag: ``name`` defaults to ``--a-b`` for field
    ``a_b`` (without a ``_s`` unit suffix), ``parse`` to the field's type; ``reload``: the settings file
    may change it while the proxy runs."""
    return {"help": help, "flag": name, "parse": parse, "metavar": metavar, "reload": reload}


def flag_fields(cls: type) -> list[Field[Any]]:
    """The fields of a settings dataclass that are flags (secrets come from env vars, groups nest)."""
    return [f for f in fields(cls) if "help" in f.metadata]


def flag_name(item: Field[Any], suffix: str = "") -> str:
    """``--name`` of a field's flag; the settings file uses the same name without the dashes."""
    name: str = item.metadata["flag"] or "--" + item.name.removesuffix("_s").replace("_", "-") + suffix
    return name


@dataclass(frozen=True)
class Timeouts:
    """Seconds (flags ``--<name>-timeout``). ``response`` is the request's one deadline; the others bound a
    phase inside it, each to find a hung engine or a lost transfer sooner (``deadline``). The defaults never
    cut a healthy stream: a 1000-token answer at a slow 200 ms per token is 200 s of streaming."""

    connect: float = field(default=5.0, metadata=flag("connecting to an engine", parse=positive_float, reload=True))
    prefill: float = field(
        default=300.0,
        metadata=flag(
            "whole prefill leg (queueing + a long prompt); past it the engine is taken as hung (502)",
            parse=positive_float,
            reload=True,
        ),
    )
    first_byte: float = field(
        default=300.0,
        metadata=flag(
            "decode: until its first body byte (write mode waits for P too), streamed or assembled for a client "
            "that asked for no stream; past it the engine is taken as hung (502); also the longest wait for a "
            "decode slot",
            parse=positive_float,
            reload=True,
        ),
    )
    kv_wait: float = field(
        default=DEFAULT_KV_WAIT_S,
        metadata=flag(
            "decode: until the first body byte, counted from prefill's answer (a request not streamed too: its "
            "decode leg streams); past the engines' "
            f"defer_timeout + transfer_timeout (+ {KV_WAIT_MARGIN_S:g} s) the KV can no longer come (the operator "
            "derives it; at most --kv-wait-limit)",
            parse=positive_float,
            reload=True,
        ),
    )
    idle: float = field(
        default=60.0,
        metadata=flag(
            "streaming decode: longest gap between two chunks; past it the engine is taken as hung",
            parse=positive_float,
            reload=True,
        ),
    )
    response: float = field(
        default=1800.0,
        metadata=flag(
            "the request's one deadline: from its arrival through the admission queue, routing, both legs, a "
            "failover and the whole answer, streamed or not; past it 504 (an error event once streaming)",
            parse=positive_float,
            reload=True,
        ),
    )
    health: float = field(default=5.0, metadata=flag("one /health probe", parse=positive_float, reload=True))


@dataclass(frozen=True)
class ProxyConfig:
    host: str = field(default="127.0.0.1", metadata=flag("API listen address"))
    port: int = field(default=8000, metadata=flag("API port"))
    registration_address: str = field(
        default=f"tcp://127.0.0.1:{REGISTRATION_PORT}", metadata=flag("ZMQ ROUTER bind address for engine heartbeats")
    )
    mode: ProxyMode = field(
        default="disaggregated", metadata=flag("disaggregated: P and D legs; colocated: one plain request")
    )
    transfer_mode: TransferModeSetting = field(
        default="auto",
        metadata=flag("auto: taken from the first registration; instances with another mode are refused"),
    )
    engines: tuple[str, ...] = field(
        default=(),
        metadata=flag("static engine http://host:port (colocated; repeat the flag)", name="--engine", metavar="URL"),
    )
    expected_engines: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "accept registrations only from this engine, given as the G2 heartbeat it sends, in JSON (repeat the "
            "flag; the operator renders one per engine); without any, the proxy discovers its engines from any "
            "well-formed frame within bounds",
            name="--expected-engine",
            metavar="JSON",
        ),
    )
    max_instances: int = field(
        default=DEFAULT_MAX_INSTANCES,
        metadata=flag(
            "most instances when discovering (no --expected-engine); frames of more are refused", parse=positive_int
        ),
    )
    engine_host: str | None = field(
        default=None,
        metadata=flag(
            "dial every registered engine's HTTP server at this host, on the port it registered (the operator "
            "sets 127.0.0.1 with hostNetwork: the engines then listen on loopback only, and register the node's "
            "address, which their KV side channels need)"
        ),
    )
    policy: Policy = field(
        default="round_robin",
        metadata=flag(
            "how engines are picked: round_robin, least_outstanding (fewest in flight from this proxy), least_load "
            "(the engines' own queue depth and KV-cache usage from their /metrics, see --load-interval), "
            "prefix_affinity (prefill by the prompt's prefix on a consistent-hash ring, for its prefix cache, "
            "least_load when that engine is saturated; decode by least_load)",
            reload=True,
        ),
    )
    affinity_prefix_tokens: int = field(
        default=64,
        metadata=flag(
            "prefix_affinity: the prompt's first this many tokens (token-id prompts), else 4x as many characters, "
            "choose the prefill engine",
            parse=positive_int,
            reload=True,
        ),
    )
    affinity_max_imbalance: int = field(
        default=DEFAULT_MAX_IMBALANCE,
        metadata=flag(
            "prefix_affinity: the prompt's engine is skipped (least_load instead) while it has more than this "
            "many requests more than the least loaded one",
            parse=non_negative_int,
            reload=True,
        ),
    )
    heartbeat_ttl_s: float | None = field(
        default=None,
        metadata=flag(
            "evict an instance this long after its last heartbeat, a rendered engine after its last heartbeat or good "
            "/health (default: 10 heartbeat intervals, 30 s G2, 50 s G1)",
            parse=positive_float,
            metavar="SECONDS",
        ),
    )
    admin_host: str | None = field(default=None, metadata=flag("admin listen address (default: --host)"))
    admin_port: int | None = field(default=8001, metadata=flag("admin port for /status and /metrics; 0 picks one"))
    network: Network = field(
        default="pod",
        metadata=flag(
            "whose network namespace the proxy runs in: pod (its loopback is the pod's: /status answers it "
            "without the admin key) or host (hostNetwork: loopback is the node's, so /status always asks for "
            "the key); only with an admin key (--admin-key-env)"
        ),
    )
    timeouts: Timeouts = field(default_factory=Timeouts)
    health_interval_s: float = field(default=5.0, metadata=flag("seconds between /health probes", parse=positive_float))
    load_interval_s: float = field(
        default=1.0,
        metadata=flag(
            "seconds between scrapes of every engine's /metrics (queue depth, KV-cache usage, vLLM's MoRI-IO "
            "transfer metrics where it has them) for the least_load policy and /status; 0 disables",
            parse=non_negative_float,
        ),
    )
    max_tokens_policy: MaxTokensPolicy = field(
        default="exact",
        metadata=flag(
            "decode-leg token limit: exact = the client's, decrement = minus 1 like vLLM's toy proxy", reload=True
        ),
    )
    max_tokens_limit: int = field(
        default=1_000_000, metadata=flag("reject larger max_tokens with 400", parse=positive_int)
    )
    no_kv_fallback: NoKvFallback = field(
        default="prefill",
        metadata=flag(
            "when prefill answers without usable kv_transfer_params (an aborted prefill): "
            "prefill = serve it on the prefill engine as a plain request, error = answer 502. Never decode: "
            "vLLM < 0.32 (write) / 0.33 (read) treats every decode request as a remote prefill",
            reload=True,
        ),
    )
    disaggregation: DisaggregationPolicy = field(
        default="always",
        metadata=flag(
            "always: every request through prefill and decode; threshold: a prompt of fewer than "
            "--disaggregation-threshold tokens, or whose part not in decode's prefix cache is, is one plain request "
            "to decode (no prefill leg, no KV transfer). Only for engines whose decode computes a plain request: "
            "vLLM >= 0.32 in write mode, >= 0.33 in read mode",
            reload=True,
        ),
    )
    disaggregation_threshold: int = field(
        default=256,
        metadata=flag(
            "threshold: prompts (or their uncached part) below this many tokens are served on decode alone; token-id "
            "prompts count exactly, text 4 ASCII characters a token",
            parse=positive_int,
            reload=True,
        ),
    )
    disaggregation_cache_tokens: int = field(
        default=262_144,
        metadata=flag(
            "threshold: the prefix cache the proxy assumes each decode engine has, in tokens (it tracks the prompts "
            "it sent each one, least recently used out past this); 0: never count a cached prefix",
            parse=non_negative_int,
        ),
    )
    max_body_bytes: int = field(
        default=8 * MIB,
        metadata=flag(
            "largest accepted request body (413 past it); a 128k-token prompt as token ids is at most 1 MiB",
            parse=positive_int,
        ),
    )
    body_budget_bytes: int = field(
        default=256 * MIB,
        metadata=flag(
            "request bodies held at once across all client connections, each from its first byte until its "
            "request is answered; a body that would pass it gets 503 + Retry-After and its connection closes",
            parse=positive_int,
        ),
    )
    max_connections: int = field(
        default=4096,
        metadata=flag(
            "client connections open at once on the API port; the next one is answered 503 + Retry-After and closed",
            parse=positive_int,
        ),
    )
    head_timeout_s: float = field(
        default=10.0,
        metadata=flag(
            "seconds from a request's first byte (a new connection's: from its accept) to its complete head; "
            "past it 408 and the connection closes (an idle keep-alive connection closes after 75 s)",
            parse=positive_float,
        ),
    )
    max_in_flight: int = field(
        default=0,
        metadata=flag(
            "serve at most this many client requests at once; the next ones wait in the admission queue "
            "(--max-queued), past it they get 429 + Retry-After; 0: no limit",
            parse=non_negative_int,
            reload=True,
        ),
    )
    max_queued: int = field(
        default=0,
        metadata=flag(
            "requests past --max-in-flight wait in a FIFO queue of at most this many, each up to --queue-timeout; "
            "0: refused at once",
            parse=non_negative_int,
            reload=True,
        ),
    )
    queue_timeout_s: float = field(
        default=30.0,
        metadata=flag(
            "longest wait in the admission queue before 429 + Retry-After", parse=positive_float, reload=True
        ),
    )
    decode_max_in_flight: int = field(
        default=0,
        metadata=flag(
            "answer 503 + Retry-After when every decode DP rank has this many requests; the operator sets the "
            "decode engine's max_num_seqs; 0: no limit",
            parse=non_negative_int,
        ),
    )
    migration_limit: int = field(
        default=1,
        metadata=flag(
            "times a streamed completion may continue on another decode engine after its decode stream broke "
            "past the first token (the prompt plus the tokens streamed, as a new P/D request); 0 disables it",
            parse=non_negative_int,
        ),
    )
    api_key: str | None = None  # required from clients when set; read from --api-key-env
    engine_api_key: str | None = None  # sent to the engines when set; read from --engine-api-key-env
    admin_key: str | None = None  # /status asks for it when set (admin_auth.py); read from --admin-key-env
    canary_interval_s: float = field(
        default=0.0, metadata=flag("seconds between canary requests; 0 disables the canary", parse=non_negative_float)
    )
    canary_model: str | None = field(
        default=None, metadata=flag("model for the canary (default: first one a decode engine lists)")
    )
    canary_prompt: str = field(default="Hello", metadata=flag("prompt of the canary request"))
    on_kv_mismatch: OnKvMismatch = field(
        default="report",
        metadata=flag(
            "when the canary's tokens through P->D differ from prefill's own (wrong KV reached decode): report = "
            "in /status, the log and pd_proxy_kv_canary_total only; stopServing = also answer client requests "
            "503 and /ready 503 from then on, until the proxy restarts or this is set back to report",
            reload=True,
        ),
    )
    drain_delay_s: float = field(
        default=0.0,
        metadata=flag(
            "seconds after SIGTERM during which every request is still served while /ready answers 503, so the "
            "Service and routers drop this replica before it stops taking requests (what a preStop sleep is for)",
            parse=non_negative_float,
        ),
    )
    otlp_traces_endpoint: str | None = field(
        default=None,
        metadata=flag(
            "export the proxy's own OpenTelemetry spans (a request span, a span per leg, parented to the client's "
            "traceparent) over OTLP/HTTP to this URL, e.g. http://collector:4318/v1/traces; needs the tracing "
            "extra (pip install 'pd-operator[tracing]'); unset: no spans",
            metavar="URL",
        ),
    )
    drain_timeout_s: float = field(
        default=30.0, metadata=flag("seconds to let streams finish on SIGTERM", parse=non_negative_float)
    )
    backlog: int = field(default=4096, metadata=flag("listen backlog of the API and admin sockets", parse=positive_int))
    config_file: str | None = field(
        default=None,
        metadata=flag(
            'JSON file of reloadable settings (flag names without dashes, e.g. {"policy": ...}); read at start and '
            "whenever its content changes; keys it lacks keep their flag values",
            metavar="PATH",
        ),
    )
    config_poll_interval_s: float = field(
        default=2.0, metadata=flag("seconds between checks of --config-file for a change", parse=positive_float)
    )
    kv_wait_limit_s: float | None = field(
        default=None,
        metadata=flag(
            "the engines' defer_timeout + transfer_timeout + margin: a --kv-wait-timeout above it is refused, at "
            "start and on reload (the operator renders it from the engines' settings)",
            parse=positive_float,
            metavar="SECONDS",
        ),
    )
