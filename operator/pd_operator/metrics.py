"""Prometheus metrics of the operator itself (served by `pdctl operator --metrics-port`)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "pd_operator_reconciles_total", "Reconciliations of PDDeployments, by trigger and result", ["trigger", "result"]
)
RECONCILE_ERRORS = Counter(
    "pd_operator_reconcile_errors_total",
    "API or proxy errors met while reconciling, by step (the object kind acted on, or proxy)",
    ["step"],
)
RECONCILE_SECONDS = Histogram(
    "pd_operator_reconcile_duration_seconds",
    "Time of one reconciliation",
    ["trigger"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CHILD_WRITES = Counter(
    "pd_operator_child_writes_total",
    "Children created or deleted, by kind and action (server-side applies, usually no-ops, are not counted)",
    ["kind", "action"],
)
PHASES = Gauge(
    "pd_operator_deployment_phase", "1 for the current phase of each PDDeployment", ["namespace", "name", "phase"]
)
PROBES = Counter("pd_operator_goodput_probes_total", "Goodput probe Jobs, by event", ["event"])

ALL_PHASES = ("Pending", "Progressing", "Ready", "Degraded", "Failed")


def set_phase(namespace: str, name: str, phase: str | None) -> None:
    for candidate in ALL_PHASES:
        PHASES.labels(namespace, name, candidate).set(1.0 if candidate == phase else 0.0)


def forget(namespace: str, name: str) -> None:
    for candidate in ALL_PHASES:
        with contextlib.suppress(KeyError):
            PHASES.remove(namespace, name, candidate)
