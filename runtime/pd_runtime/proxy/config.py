"""The proxy's settings: one frozen value built by the CLI (or by tests), read everywhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pd_runtime.proxy.legs import MaxTokensPolicy, ProxyMode
from pd_runtime.proxy.registry import TransferModeSetting
from pd_runtime.proxy.routing import Policy

ReadFallback = Literal["decode", "error"]


@dataclass(frozen=True)
class Timeouts:
    """Seconds. The defaults never cut a healthy stream: a 1000-token answer at a slow 200 ms per
    token is 200 s of streaming, but only the gap between chunks is bounded once it has started."""

    connect: float = 5.0
    prefill: float = 300.0  # whole prefill leg (queueing + a long prompt)
    first_byte: float = 300.0  # streaming decode: until the first body byte (write mode waits for P too)
    idle: float = 60.0  # streaming decode: longest gap between two chunks
    response: float = 1800.0  # non-streaming decode: whole response (the engine answers only when done)
    health: float = 5.0  # one /health probe


@dataclass(frozen=True)
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    registration_address: str = "tcp://127.0.0.1:36367"
    mode: ProxyMode = "disaggregated"
    transfer_mode: TransferModeSetting = "auto"
    engines: tuple[str, ...] = ()
    policy: Policy = "round_robin"
    heartbeat_ttl_s: float | None = None  # None: three heartbeat intervals of the instance's generation
    admin_host: str | None = None  # None: same as host
    admin_port: int | None = 8001  # None: no admin server
    timeouts: Timeouts = field(default_factory=Timeouts)
    health_interval_s: float = 5.0
    max_tokens_policy: MaxTokensPolicy = "exact"
    max_tokens_limit: int = 1_000_000
    read_fallback: ReadFallback = "decode"
    max_body_bytes: int = 32 * 1024 * 1024
    max_in_flight: int = 0  # 0: no admission limit
    api_key: str | None = None  # required from clients when set
    engine_api_key: str | None = None  # sent to the engines when set
    canary_interval_s: float = 0.0  # 0: no canary
    canary_model: str | None = None  # None: the first model a decode engine lists
    canary_prompt: str = "Hello"
    drain_timeout_s: float = 30.0
    backlog: int = 4096
