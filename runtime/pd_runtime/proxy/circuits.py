"""Each instance's circuit breaker told how the legs routed to it ended (docs/proxy.md, "Circuit breaker").

``breaker`` is the pure state machine of one instance; this is its bookkeeping on the request path:
which registered instance a leg's target is, whom a failed leg blames, and the log and the metric when
a breaker opens or closes.
"""

from __future__ import annotations

import logging
import time

from pd_runtime.proxy.breaker import OpenReason
from pd_runtime.proxy.errors import LegFailure
from pd_runtime.proxy.legs import Target
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Instance, Registry

log = logging.getLogger(__name__)


class Circuits:
    def __init__(self, registry: Registry, metrics: ProxyMetrics) -> None:
        self.registry = registry
        self.metrics = metrics

    def instance(self, target: Target) -> Instance | None:
        """The registered instance ``target`` was chosen from (None once it left the registry)."""
        return self.registry.instances.get(target.instance.http_address)

    def routed_to(self, *targets: Target | None) -> None:
        for target in targets:
            if target is not None and (inst := self.instance(target)) is not None:
                inst.breaker.routed()

    def answered_by(self, target: Target) -> None:
        inst = self.instance(target)
        if inst is not None and inst.breaker.answered():
            log.info("circuit closed: instance back in rotation role=%s http=%s", inst.role, inst.key)

    def abandoned_on(self, target: Target) -> None:
        if (inst := self.instance(target)) is not None:
            inst.breaker.abandoned()

    def opened(self, target: Target, reason: OpenReason, failure: LegFailure) -> None:
        inst = self.instance(target)
        if inst is None:
            return
        self.metrics.circuit_opens.labels(inst.role, reason).inc()
        log.warning(
            "circuit open: instance out of rotation role=%s http=%s reason=%s after %s",
            inst.role,
            inst.key,
            reason,
            failure,
        )

    def verdict(self, target: Target, prefill: Target | None) -> Verdict:
        """``with``: tell ``target``'s circuit breaker how the leg inside ended; ``prefill``: the request's
        prefill target, blamed when a write-mode decode timed out waiting for it."""
        return Verdict(self, target, prefill)

    def _leg_failed(self, target: Target, prefill: Target | None, failure: LegFailure) -> None:
        """A leg on ``target`` failed: an engine failure counts against the instance it blames (a write-mode
        decode that timed out waiting for prefill blames prefill); a refusal is an answer; a lost KV
        transfer says nothing about the engine."""
        blamed = prefill if failure.leg == "prefill" and prefill is not None else target
        if blamed is not target:
            self.abandoned_on(target)
        if failure.engine_failed:
            inst = self.instance(blamed)
            if inst is not None and (reason := inst.breaker.failed(failure.kind == "timeout", time.monotonic())):
                self.opened(blamed, reason, failure)
        elif failure.kind == "kv_timeout":
            self.abandoned_on(blamed)
        else:
            self.answered_by(blamed)


class Verdict:
    """``Circuits.verdict``: a failed leg's failure (``LegFailure``) counts against the instance it blames; any
    other exit (the client left, the leg was cancelled) gives no verdict; a leg that ended well is an
    answer. A class, not a generator context manager: contextlib's stays interpreted under mypyc."""

    __slots__ = ("_circuits", "_prefill", "_target")

    def __init__(self, circuits: Circuits, target: Target, prefill: Target | None) -> None:
        self._circuits = circuits
        self._target = target
        self._prefill = prefill

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, failure: BaseException | None, tb: object) -> None:
        if failure is None:
            self._circuits.answered_by(self._target)
        elif isinstance(failure, LegFailure):
            self._circuits._leg_failed(self._target, self._prefill, failure)
        else:
            self._circuits.abandoned_on(self._target)
