"""The circuit breaker of one instance, as a pure state machine (no I/O, time passed in)."""

from __future__ import annotations

from pd_runtime.proxy.breaker import FAILURE_THRESHOLD, MAX_PROBES_NEEDED, Breaker


def opened_by_timeout(at: float = 10.0) -> Breaker:
    breaker = Breaker()
    assert breaker.failed(timeout=True, now=at) == "timeout"
    return breaker


def test_a_leg_timeout_opens_at_once_and_an_open_breaker_admits_nothing() -> None:
    breaker = opened_by_timeout()
    assert (breaker.state, breaker.reason, breaker.opened_at) == ("open", "timeout", 10.0)
    assert not breaker.admits
    assert breaker.failed(timeout=True, now=11.0) is None  # already open: no second opening


def test_consecutive_failures_open_it_and_an_answer_in_between_resets_the_count() -> None:
    breaker = Breaker()
    for _ in range(FAILURE_THRESHOLD - 1):
        assert breaker.failed(timeout=False, now=1.0) is None
    assert breaker.answered() is False  # it was closed
    for _ in range(FAILURE_THRESHOLD - 1):
        assert breaker.failed(timeout=False, now=2.0) is None
    assert breaker.admits
    assert breaker.failed(timeout=False, now=3.0) == "failures"
    assert not breaker.admits


def test_a_failover_opens_it() -> None:
    breaker = Breaker()
    assert breaker.failed_over(now=1.0) == "failover"
    assert breaker.failed_over(now=2.0) is None and breaker.opened_at == 1.0


def test_half_open_needs_a_heartbeat_after_the_opening_and_a_good_probe() -> None:
    breaker = opened_by_timeout(at=10.0)
    assert breaker.probed(ok=True, last_heartbeat=9.0) is False  # no heartbeat since it opened
    assert breaker.probed(ok=False, last_heartbeat=12.0) is False
    assert breaker.state == "open"
    assert breaker.probed(ok=True, last_heartbeat=12.0) is True
    assert breaker.state == "half_open" and breaker.reason == "timeout"


def test_a_static_engine_needs_only_the_probe() -> None:
    breaker = opened_by_timeout()
    assert breaker.probed(ok=True, last_heartbeat=None) is True


def test_half_open_admits_exactly_one_trial_whose_answer_closes_it() -> None:
    breaker = opened_by_timeout()
    breaker.probed(ok=True, last_heartbeat=11.0)
    assert breaker.admits
    breaker.routed()
    assert not breaker.admits  # the trial is out: nothing else until its verdict
    assert breaker.answered() is True
    assert (breaker.state, breaker.reason, breaker.failures, breaker.admits) == ("closed", None, 0, True)


def test_an_abandoned_trial_lets_the_next_request_be_the_trial() -> None:
    breaker = opened_by_timeout()
    breaker.probed(ok=True, last_heartbeat=11.0)
    breaker.routed()
    breaker.abandoned()
    assert breaker.state == "half_open" and breaker.admits


def test_a_failed_trial_opens_it_again_and_doubles_the_probes_needed() -> None:
    breaker = opened_by_timeout(at=10.0)
    beat = 10.0
    for cycle in range(10):
        needed = breaker.probes_needed
        assert needed == min(2**cycle, MAX_PROBES_NEEDED)
        beat += 1
        for _ in range(needed - 1):
            assert breaker.probed(ok=True, last_heartbeat=beat) is False
        assert breaker.probed(ok=True, last_heartbeat=beat) is True
        breaker.routed()
        assert breaker.failed(timeout=True, now=beat) == "trial"
        assert breaker.opened_at == beat and not breaker.admits
    assert breaker.probes_needed == MAX_PROBES_NEEDED
    breaker.probed(ok=True, last_heartbeat=beat + 1)
    assert breaker.state == "open"  # one good probe is no longer enough


def test_a_failed_probe_restarts_the_count_of_good_ones() -> None:
    breaker = opened_by_timeout(at=10.0)
    breaker.probes_needed = 2
    assert breaker.probed(ok=True, last_heartbeat=11.0) is False
    assert breaker.probed(ok=False, last_heartbeat=11.0) is False
    assert breaker.probed(ok=True, last_heartbeat=11.0) is False
    assert breaker.probed(ok=True, last_heartbeat=11.0) is True
