"""Pure: the admin ``GET /status`` document (contract 3 of the team brief; the operator reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pd_runtime.proxy.registry import Instance, Registry
from pd_runtime.proxy.routing import Router


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class LastTransfer:
    """The newest transfer id whose prefill AND decode legs both succeeded."""

    transfer_id: str
    completed_at: datetime
    prefill: str
    decode: str
    source: Literal["request", "canary"]

    def to_json(self) -> dict[str, Any]:
        return {
            "transfer_id": self.transfer_id,
            "completed_at": rfc3339(self.completed_at),
            "prefill": self.prefill,
            "decode": self.decode,
            "source": self.source,
        }


@dataclass(frozen=True)
class CanaryState:
    enabled: bool
    ok: bool | None = None
    at: datetime | None = None
    error: str | None = None
    kv_match: bool | None = None
    """The last run's token comparison (kvcheck.py); None when it could not compare."""
    kv_mismatch: dict[str, Any] | None = None
    """The first mismatch since the proxy started (``KvMismatch.to_json``): kept, later matches do not clear it."""
    serving_stopped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "ok": self.ok,
            "at": None if self.at is None else rfc3339(self.at),
            "error": self.error,
            "kv_match": self.kv_match,
            "kv_mismatch": self.kv_mismatch,
            "serving_stopped": self.serving_stopped,
        }


def instance_json(registry: Registry, router: Router, inst: Instance, now: float) -> dict[str, Any]:
    """One instance: registration, liveness, and its load (the engine's last report per DP rank, and
    what this proxy has in flight on it and ever sent it)."""
    age = inst.heartbeat_age(now)
    load_age = None if inst.load_at is None else round(max(0.0, now - inst.load_at), 3)
    return {
        "role": inst.role,
        "http_address": inst.key,
        "zmq_address": None if inst.generation == "static" else inst.registration.zmq_address,
        "heartbeat_age_s": None if age is None else round(age, 3),
        "healthy": registry.is_live(inst, now),
        "dp_size": inst.registration.dp_size,
        "tp_size": inst.registration.tp_size,
        "transfer_mode": inst.transfer_mode,
        "vllm_version": inst.vllm_version,
        "generation": inst.generation,
        "in_flight": router.in_flight(inst.key),
        "routed": router.routed(inst.key),
        "load": {str(rank): load.to_json() for rank, load in sorted(inst.load.items())},
        "load_age_s": load_age,
        "moriio_metrics": None if inst.moriio is None else inst.moriio.to_json(),
        "circuit": inst.breaker.to_json(),
    }


def build_status(
    registry: Registry,
    router: Router,
    now: float,
    in_flight: int,
    last_transfer: LastTransfer | None,
    canary: CanaryState,
) -> dict[str, Any]:
    return {
        "mode": registry.mode,
        "transfer_mode": None if registry.transfer_mode is None else registry.transfer_mode.lower(),
        "policy": router.policy,
        "instances": [instance_json(registry, router, inst, now) for inst in registry.instances.values()],
        "counts": {
            "prefill": len(registry.live("P", now)),
            "decode": len(registry.live("D", now)),
            "engines": len(registry.live(None, now)),
            "in_flight": in_flight,
        },
        "last_transfer": None if last_transfer is None else last_transfer.to_json(),
        "canary": canary.to_json(),
    }
