"""Instance liveness as data (no I/O): registrations, heartbeat TTL, /health results, transfer modes.

The ZMQ listener and the /health prober (``listener``) feed it; routing and /status read it. Time is
passed in (``now``, monotonic seconds) so every rule is unit-testable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from pd_runtime.protocol import PING_INTERVAL_S, Registration, TransferMode
from pd_runtime.proxy.breaker import Breaker
from pd_runtime.proxy.gate import (
    DEFAULT_MAX_INSTANCES,
    NEW_INSTANCES_BURST,
    NEW_INSTANCES_PER_S,
    Refusal,
    RefusalSummary,
    TokenBucket,
    Verdict,
    expected_by_address,
    judge,
)
from pd_runtime.proxy.legs import ProxyMode
from pd_runtime.proxy.load import EngineLoad
from pd_runtime.proxy.moriio_metrics import MoriioMetrics

log = logging.getLogger(__name__)

InstanceRole = Literal["P", "D", "E"]
InstanceGeneration = Literal["G1", "G2", "static"]
TransferModeSetting = Literal["auto", "write", "read"]

# An instance counts as unhealthy after this many consecutive failed /health probes; one success heals.
# A new instance starts at the threshold: vLLM heartbeats from its workers before its HTTP server is up,
# so an instance enters the rotation only after its first successful probe (sent as it registers).
HEALTH_FAILURE_THRESHOLD = 2
# A load report older than this many scrape intervals is not used for routing (the scrape failed or lags).
LOAD_STALE_INTERVALS = 3
# TTL = this many heartbeat intervals of the instance's generation unless --heartbeat-ttl is given: 30 s
# for G2. Before vLLM 0.32 the heartbeat is a thread inside the GPU worker (moriio_connector.py,
# MoRIIOConnectorWorker._ping), which shares the GIL with the model runner and misses beats during long
# steps; 0.32 moved it to a subprocess. A long TTL costs little: an engine that stops answering leaves
# the rotation through its failed /health probes (HEALTH_FAILURE_THRESHOLD), so the TTL only decides
# when a silent instance is forgotten. An engine the operator rendered (``--expected-engine``) has a
# second liveness signal: a successful /health probe within the TTL keeps it, so strangers' frames that
# delay its heartbeats (a registration flood) cannot evict it.
DEFAULT_TTL_BEATS = 10


@dataclass
class Instance:
    registration: Registration
    role: InstanceRole
    generation: InstanceGeneration
    transfer_mode: TransferMode | None
    last_heartbeat: float | None  # monotonic; None for static engines, which never expire
    health_failures: int = HEALTH_FAILURE_THRESHOLD
    last_health_ok: float | None = None  # monotonic time of its last successful /health probe
    load: dict[int, EngineLoad] = field(default_factory=dict)  # DP rank -> its last /metrics report
    load_at: float | None = None  # monotonic time of that report
    breaker: Breaker = field(default_factory=Breaker)  # open: out of rotation after failed or timed-out legs
    dial_host: str = ""  # --engine-host: its HTTP server is reached there, not at the registered host
    vllm_version: str | None = None  # the release its GET /version answers, read once it is healthy
    moriio: MoriioMetrics | None = None  # its vllm:moriio_* families at the last scrape; None: it has none
    key: str = field(init=False)  # http_address, computed once: routing reads it on every request

    def __post_init__(self) -> None:
        self.key = self.registration.http_address

    @property
    def http_host(self) -> str:
        """The host its HTTP server is dialled at (the registered one unless ``dial_host``)."""
        reg = self.registration
        return self.dial_host or reg.http_host or reg.host

    @property
    def base_url(self) -> str:
        return (
            f"http://{self.dial_host}:{self.registration.http_port}" if self.dial_host else self.registration.base_url
        )

    @property
    def healthy(self) -> bool:
        return self.health_failures < HEALTH_FAILURE_THRESHOLD

    def heartbeat_age(self, now: float) -> float | None:
        return None if self.last_heartbeat is None else max(0.0, now - self.last_heartbeat)


def static_engine(url: str) -> Instance:
    """An engine listed with --engine: colocated engines have no KV connector, so they never register.

    The synthetic registration carries only the HTTP address; side-channel ports are unused.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(f"--engine wants http://host:port, got {url!r}")
    registration = Registration(
        role="D",
        host=parts.hostname,
        http_port=parts.port,
        handshake_port=0,
        notify_port=0,
        dp_size=1,
        tp_size=1,
        transfer_mode="WRITE",
        generation="G2",
    )
    return Instance(registration, role="E", generation="static", transfer_mode=None, last_heartbeat=None)


@dataclass(frozen=True)
class Observation:
    """What one registration frame did to the registry (the outcome is its metric label)."""

    outcome: Literal["added", "refreshed"] | Refusal
    reason: str = ""


class Registry:
    def __init__(
        self,
        mode: ProxyMode,
        transfer_mode: TransferModeSetting,
        ttl_s: float | None,
        static: list[Instance],
        load_interval_s: float = 0.0,
        expected: Sequence[Registration] | None = None,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        engine_host: str | None = None,
    ) -> None:
        """``expected``: the only engines whose frames are accepted (gate.py); None with no static
        engines: discovery. Static engines never register, so with them every frame is refused.
        ``engine_host``: where registered engines' HTTP servers are dialled (``Instance.dial_host``)."""
        self.mode = mode
        self.engine_host = engine_host or ""
        self.load_max_age_s = LOAD_STALE_INTERVALS * load_interval_s
        self.transfer_mode_setting = transfer_mode
        self.ttl_override = ttl_s
        self.instances: dict[str, Instance] = {inst.key: inst for inst in static}
        self._auto_mode: TransferMode | None = None
        self.expected = expected_by_address(expected) if expected is not None else ({} if static else None)
        self.max_instances = max_instances
        self._new_instances = TokenBucket(NEW_INSTANCES_PER_S, NEW_INSTANCES_BURST)
        self.refusals = RefusalSummary()

    @property
    def transfer_mode(self) -> TransferMode | None:
        """The cluster's transfer mode: configured, or taken from the first accepted registration."""
        if self.mode == "colocated":
            return None
        if self.transfer_mode_setting == "auto":
            return self._auto_mode
        return "WRITE" if self.transfer_mode_setting == "write" else "READ"

    def ttl(self, inst: Instance) -> float:
        if self.ttl_override is not None:
            return self.ttl_override
        interval = PING_INTERVAL_S["G1"] if inst.generation == "G1" else PING_INTERVAL_S["G2"]
        return DEFAULT_TTL_BEATS * interval

    def observe(self, reg: Registration, now: float) -> Observation:
        """One heartbeat: refresh a known instance, or upsert by http_address what the gate (gate.py), the
        transfer mode and the rate of new instances admit; a refusal leaves every instance as it was."""
        known = self.instances.get(reg.http_address)
        if known is not None and known.registration == reg:
            known.last_heartbeat = now
            return Observation("refreshed")
        verdict = self._refusal(reg, known, now)
        if verdict is not None:
            self.refusals.add(verdict)
            self._log_refusals(now)
            return Observation(verdict.result, verdict.reason)
        if self.mode == "disaggregated" and self.transfer_mode_setting == "auto" and self._auto_mode is None:
            self._auto_mode = reg.transfer_mode
            log.info("transfer mode set to %s by the first registration (%s)", reg.transfer_mode, reg.http_address)
        fresh = Instance(
            reg, reg.role, reg.generation, reg.transfer_mode, last_heartbeat=now, dial_host=self.engine_host
        )
        if known is not None:
            fresh.health_failures, fresh.last_health_ok = known.health_failures, known.last_health_ok
            fresh.load, fresh.load_at, fresh.breaker = known.load, known.load_at, known.breaker
            fresh.vllm_version, fresh.moriio = known.vllm_version, known.moriio
        self.instances[reg.http_address] = fresh
        return Observation("added")

    def _refusal(self, reg: Registration, known: Instance | None, now: float) -> Verdict | None:
        known_reg = None if known is None else known.registration
        verdict = judge(reg, known_reg, len(self.instances), self.expected, self.max_instances)
        conflict = "" if verdict is not None else self._mode_conflict(reg)
        if conflict:
            return Verdict("refused_mismatch", conflict)
        if verdict is None and not self._new_instances.take(now):
            return Verdict("rate_limited", f"{reg.http_address}: over {NEW_INSTANCES_PER_S:g} new or changed a second")
        return verdict

    def _log_refusals(self, now: float) -> None:
        line = self.refusals.due(now)
        if line:
            log.warning("registration frames refused: %s", line)

    def _mode_conflict(self, reg: Registration) -> str:
        expected = self.transfer_mode
        if self.mode == "colocated" or expected is None or reg.transfer_mode == expected:
            return ""
        return f"{reg.http_address} registered transfer_mode {reg.transfer_mode}, the proxy uses {expected}"

    def is_expected(self, inst: Instance) -> bool:
        """One of the engines the operator rendered (``--expected-engine``)."""
        return self.expected is not None and inst.key in self.expected

    def signal_age(self, inst: Instance, now: float) -> float | None:
        """Seconds since its last liveness signal (None: static, never expires): the heartbeat, and for an
        expected engine also a successful /health probe, whichever came last."""
        if inst.last_heartbeat is None:
            return None
        last = inst.last_heartbeat
        if inst.last_health_ok is not None and self.is_expected(inst):
            last = max(last, inst.last_health_ok)
        return max(0.0, now - last)

    def several(self, role: InstanceRole) -> bool:
        """Whether more than one instance of a role is known, live or not: only then can a decode stream
        that breaks go on elsewhere (docs/proxy.md, "Migration")."""
        seen = False
        for inst in self.instances.values():
            if inst.role == role:
                if seen:
                    return True
                seen = True
        return False

    def sweep(self, now: float) -> list[Instance]:
        """Remove instances whose last liveness signal is older than their TTL; returns the evicted ones."""
        evicted = [inst for inst in self.instances.values() if (self.signal_age(inst, now) or 0.0) > self.ttl(inst)]
        for inst in evicted:
            del self.instances[inst.key]
        if evicted and not any(inst.last_heartbeat is not None for inst in self.instances.values()):
            self._auto_mode = None  # every registered instance is gone: the next one may set the mode again
        self._log_refusals(now)  # the sweep runs every second at most: a summary is never held back long
        return evicted

    def record_health(self, key: str, ok: bool, now: float) -> Instance | None:
        """A /health result; good ones also move an open circuit breaker to half-open (``breaker``)."""
        inst = self.instances.get(key)
        if inst is not None:
            inst.health_failures = 0 if ok else inst.health_failures + 1
            if ok:
                inst.last_health_ok = now
            if inst.breaker.probed(ok, inst.last_heartbeat):
                log.info("circuit half-open, one trial request next role=%s http=%s", inst.role, inst.key)
        return inst

    def record_version(self, key: str, version: str) -> None:
        inst = self.instances.get(key)
        if inst is not None:
            inst.vllm_version = version

    def record_load(self, key: str, load: dict[int, EngineLoad], now: float) -> None:
        inst = self.instances.get(key)
        if inst is not None:
            inst.load, inst.load_at = load, now

    def record_moriio(self, key: str, moriio: MoriioMetrics | None) -> None:
        inst = self.instances.get(key)
        if inst is not None:
            inst.moriio = moriio

    def fresh_load(self, inst: Instance, now: float) -> dict[int, EngineLoad]:
        """The instance's last load report if it is recent enough to route by, else {}."""
        if inst.load_at is None or now - inst.load_at > self.load_max_age_s:
            return {}
        return inst.load

    def is_live(self, inst: Instance, now: float) -> bool:
        age = self.signal_age(inst, now)
        return inst.healthy and inst.breaker.admits and (age is None or age <= self.ttl(inst))

    def live(self, role: InstanceRole | None, now: float) -> list[Instance]:
        """Routable instances of a role (None: every instance, as colocated mode routes)."""
        return [
            inst for inst in self.instances.values() if (role is None or inst.role == role) and self.is_live(inst, now)
        ]
