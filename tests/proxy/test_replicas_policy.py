"""The router's replica policy and its readings of EndpointSlices and proxy /status documents."""

from __future__ import annotations

from pd_runtime.proxy.replicas import Replica, pick, ready_addresses, reported_in_flight


def test_pick_takes_the_least_loaded_replica() -> None:
    replicas = [Replica("a:8000", in_flight=3), Replica("b:8000", in_flight=1), Replica("c:8000", in_flight=2)]
    assert pick(replicas) == replicas[1]


def test_a_proxy_reporting_more_work_than_this_router_sent_counts_as_busy() -> None:
    """The other router replica's traffic shows only in the proxy's own count."""
    busy_elsewhere = Replica("a:8000", in_flight=0, reported=5)
    assert pick([busy_elsewhere, Replica("b:8000", in_flight=2, reported=1)]).address == "b:8000"  # type: ignore[union-attr]


def test_a_stale_report_does_not_hide_what_this_router_just_sent() -> None:
    just_sent = Replica("a:8000", in_flight=4, reported=0)
    assert pick([just_sent, Replica("b:8000", in_flight=1, reported=2)]).address == "b:8000"  # type: ignore[union-attr]


def test_ties_go_to_the_replica_routed_least_then_by_address() -> None:
    assert pick([Replica("a:8000", routed=5), Replica("b:8000", routed=2)]).address == "b:8000"  # type: ignore[union-attr]
    assert pick([Replica("b:8000"), Replica("a:8000")]).address == "a:8000"  # type: ignore[union-attr]


def test_pick_skips_replicas_to_avoid_and_may_find_none() -> None:
    replicas = [Replica("a:8000"), Replica("b:8000", in_flight=9)]
    assert pick(replicas, avoid=frozenset({"a:8000"})) == replicas[1]
    assert pick(replicas, avoid=frozenset({"a:8000", "b:8000"})) is None
    assert pick([]) is None


def test_ready_addresses_reads_every_slice_and_drops_not_ready_endpoints() -> None:
    slices = [
        {"endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": True}}, {"addresses": ["10.0.0.9"]}]},
        {"endpoints": [{"addresses": ["10.0.1.3"], "conditions": {"ready": False, "terminating": True}}]},
        {"endpoints": None},
        {"endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": True}}]},
    ]
    assert ready_addresses(slices, 8000) == ["10.0.0.2:8000", "10.0.0.9:8000"]


def test_reported_in_flight_reads_the_proxy_status_document() -> None:
    assert reported_in_flight({"in_flight": 7, "instances": []}) == 7
    assert reported_in_flight({}) == 0 and reported_in_flight({"in_flight": "x"}) == 0
    assert reported_in_flight({"in_flight": -1}) == 0
