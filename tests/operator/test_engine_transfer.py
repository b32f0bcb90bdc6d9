"""status.replicaStatuses[].engineTransfer: vLLM's own transfer failure counters (vLLM main's
``vllm:moriio_*``) summed over a replica's engines, counted since the last goodput probe."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from pd_operator import decide
from pd_operator.actions import Create
from pd_operator.api import EngineTransferStatus
from pd_operator.engine_transfer import engine_transfer, replica_totals
from tests.operator.podfacts import finished_job, proxy_status, summary
from tests.operator.test_decide import T0, one_proxy, serving, snapshot, stored

FAILED, NOTIFY, EXPIRED = (
    "vllm:moriio_num_failed_transfers",
    "vllm:moriio_num_failed_notifications",
    "vllm:moriio_num_kv_expired_reqs",
)
PROBE = "2026-11-29T08:00:00Z"


def with_counters(prefill: dict[str, Any] | None, decode: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proxy's /status with each engine's ``moriio_metrics`` (None: that engine exports none)."""
    doc = proxy_status()
    for inst, moriio in zip(doc["instances"], (prefill, decode), strict=True):
        inst["moriio_metrics"] = moriio
    return doc


def test_the_counters_are_summed_over_the_engines_and_histograms_left_out() -> None:
    doc = with_counters(
        {FAILED: 2.0, EXPIRED: 1.0, "vllm:moriio_xfer_time_seconds": {"count": 9.0, "sum": 0.5}},
        {FAILED: 1.0, NOTIFY: 0.0},
    )
    assert replica_totals(doc) == {FAILED: 3, EXPIRED: 1, NOTIFY: 0}


def test_engines_without_them_give_none() -> None:
    assert replica_totals(with_counters(None, None)) is None
    assert replica_totals(proxy_status()) is None
    assert replica_totals(None) is None


def test_a_pods_first_read_counts_from_zero_and_a_new_probe_from_its_read() -> None:
    first = engine_transfer({FAILED: 2}, None, PROBE)
    assert first == EngineTransferStatus(
        totals={FAILED: 2}, since_probe={FAILED: 2}, at_probe={FAILED: 0}, probe_time=PROBE
    )
    same_probe = engine_transfer({FAILED: 5}, first, PROBE)
    assert same_probe is not None and same_probe.since_probe == {FAILED: 5}
    new_probe = engine_transfer({FAILED: 5}, same_probe, "2026-11-29T09:00:00Z")
    assert new_probe is not None and (new_probe.since_probe, new_probe.at_probe) == ({FAILED: 0}, {FAILED: 5})
    later = engine_transfer({FAILED: 7}, new_probe, "2026-11-29T09:00:00Z")
    assert later is not None and later.since_probe == {FAILED: 2}


def test_a_restarted_engine_counts_from_its_restart_and_an_unread_proxy_keeps_the_last() -> None:
    before = EngineTransferStatus(totals={FAILED: 9}, since_probe={FAILED: 4}, at_probe={FAILED: 5}, probe_time=PROBE)
    restarted = engine_transfer({FAILED: 1}, before, PROBE)
    assert restarted is not None and (restarted.since_probe, restarted.at_probe) == ({FAILED: 1}, {FAILED: 0})
    assert engine_transfer(None, before, PROBE) is before


def test_through_decide_the_failures_count_from_the_probes_end() -> None:
    pod = serving()
    started = decide.decide(snapshot(pods=[pod], proxies=one_proxy(status=with_counters({FAILED: 2.0, EXPIRED: 1.0}))))
    status = stored({}, started)
    assert status["replicaStatuses"][0]["engineTransfer"] == {
        "totals": {FAILED: 2, EXPIRED: 1},
        "sinceProbe": {FAILED: 2, EXPIRED: 1},  # no probe finished yet: since the engines started
        "atProbe": {FAILED: 0, EXPIRED: 0},
    }
    job = next(a.obj for a in started.actions if isinstance(a, Create) and a.obj["kind"] == "Job")
    done, job_pod = finished_job(job, json.dumps(summary(0.95)))
    at_end = with_counters({FAILED: 3.0, EXPIRED: 1.0})
    finished = decide.decide(
        snapshot(
            status=status,
            pods=[pod, job_pod],
            jobs=[done],
            now=T0 + timedelta(seconds=30),
            proxies=one_proxy(status=at_end),
        )
    )
    status = stored(status, finished)
    assert status["replicaStatuses"][0]["engineTransfer"]["sinceProbe"] == {FAILED: 0, EXPIRED: 0}
    after = with_counters({FAILED: 5.0, EXPIRED: 2.0})
    later = decide.decide(
        snapshot(status=status, pods=[pod], now=T0 + timedelta(seconds=60), proxies=one_proxy(status=after))
    )
    shown = stored(status, later)["replicaStatuses"][0]["engineTransfer"]
    assert shown == {
        "totals": {FAILED: 5, EXPIRED: 2},
        "sinceProbe": {FAILED: 2, EXPIRED: 1},
        "atProbe": {FAILED: 3, EXPIRED: 1},
        "probeTime": status["goodput"]["time"],
    }


def test_a_release_shows_nothing_and_its_proxy_is_not_read_for_it() -> None:
    spec = {"model": "m", "engine": "simulated", "proxy": {"canaryIntervalSeconds": 0}}
    pod = serving(spec)
    released = stored({}, decide.decide(snapshot(spec, pods=[pod], proxies=one_proxy(status=with_counters(None)))))
    assert "engineTransfer" not in released["replicaStatuses"][0]
    assert not decide.proxy_urls(snapshot(spec, status=released, pods=[pod]))
    main = stored({}, decide.decide(snapshot(spec, pods=[pod], proxies=one_proxy(status=with_counters({FAILED: 0.0})))))
    assert decide.proxy_urls(snapshot(spec, status=main, pods=[pod])) == {"demo": "http://10.1.2.3:8001/status"}
