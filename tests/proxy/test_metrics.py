"""The proxy's lock-free histograms are exposed exactly as prometheus_client's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pd_runtime.proxy.metrics import LoopHistogram

SAMPLES = (0.0005, 0.005, 0.007, 2.0, 100.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_loop_histogram_matches_prometheus_client_with_and_without_a_label() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labelled = LoopHistogram("pd_leg_seconds", "legs", (0.005, 0.01, 1, 5), ours, label="leg")
    plain = LoopHistogram("pd_gap_seconds", "gaps", (0.001, 0.01), ours)
    reference_labelled = Histogram("pd_leg_seconds", "legs", ["leg"], buckets=(0.005, 0.01, 1, 5), registry=theirs)
    reference_plain = Histogram("pd_gap_seconds", "gaps", buckets=(0.001, 0.01), registry=theirs)
    for value in SAMPLES:
        for leg in ("prefill", "decode"):
            labelled.labels(leg).observe(value)
            reference_labelled.labels(leg).observe(value)
        plain.observe(value)
        reference_plain.observe(value)
    assert _exposition(ours) == _exposition(theirs)
    assert 'pd_leg_seconds_bucket{le="0.005",leg="decode"} 2.0' in _exposition(ours)
