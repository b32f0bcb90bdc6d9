"""Prometheus metrics of the operator itself (served by `pdctl operator --metrics-port`)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from pd_operator.api import PDDeploymentStatus

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
# spec.autoscaling's inputs and output, per PDDeployment: what an HPA or KEDA trigger can scale on instead.
_SCALING = ["namespace", "name"]
CAPACITY = Gauge(
    "pd_operator_capacity_requests_per_second",
    "Requests per second one replica holds within the goodput probe's SLO (status.capacity)",
    _SCALING,
)
DEMAND = Gauge(
    "pd_operator_demand_requests_per_second",
    "Requests per second the replicas' proxies see, summed (status.demand)",
    _SCALING,
)
DEMAND_IN_FLIGHT = Gauge("pd_operator_demand_in_flight", "Requests in flight over the replicas' proxies", _SCALING)
DESIRED_REPLICAS = Gauge(
    "pd_operator_desired_replicas", "Replicas spec.autoscaling asks for (status.autoscaling)", _SCALING
)
_SCALING_GAUGES = (CAPACITY, DEMAND, DEMAND_IN_FLIGHT, DESIRED_REPLICAS)

ALL_PHASES = ("Pending", "Progressing", "Ready", "Degraded", "Failed")


def set_phase(namespace: str, name: str, phase: str | None) -> None:
    for candidate in ALL_PHASES:
        PHASES.labels(namespace, name, candidate).set(1.0 if candidate == phase else 0.0)


def set_scaling(namespace: str, name: str, status: PDDeploymentStatus) -> None:
    """The autoscaling gauges from the status just decided; a figure the status lacks is no series."""
    capacity, demand, scaling = status.capacity, status.demand, status.autoscaling
    figures: tuple[float | None, ...] = (
        None if capacity is None else capacity.requests_per_second,
        None if demand is None else demand.requests_per_second,
        None if demand is None else demand.in_flight,
        None if scaling is None else scaling.desired_replicas,
    )
    for gauge, value in zip(_SCALING_GAUGES, figures, strict=True):
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        else:
            gauge.labels(namespace, name).set(float(value))


def forget(namespace: str, name: str) -> None:
    for candidate in ALL_PHASES:
        with contextlib.suppress(KeyError):
            PHASES.remove(namespace, name, candidate)
    for gauge in _SCALING_GAUGES:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
