"""Each instance's circuit breaker told how the legs routed to it ended (docs/proxy.md, "Circuit breaker").

``breaker`` is the pure state machine of one instance; this is its bookkeeping on the request path:
which registered instance a leg's target is, whom a failed leg blames, and the log and the metric when
a breaker opens or closes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

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

    @contextlib.contextmanager
    def verdict(self, target: Target, prefill: Target | None) -> Iterator[None]:
        """Tell ``target``'s circuit breaker how the leg inside ended; ``prefill``: the request's prefill
        target, blamed when a write-mode decode timed out waiting for it."""
        try:
            yield
        except LegFailure as failure:
            self._leg_failed(target, prefill, failure)
            raise
        except BaseException:
            self.abandoned_on(target)  # the client left or the leg was cancelled: no verdict
            raise
        self.answered_by(target)

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
