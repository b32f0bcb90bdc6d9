"""The proxy's demand window (admin /status ``demand``), in virtual time."""

from __future__ import annotations

from pd_runtime.proxy.demand import DemandWindow, asked_output_tokens, reported_prompt_tokens


def test_the_rate_covers_the_window_or_the_time_since_start() -> None:
    window = DemandWindow(started=100.0, window_s=30)
    for i in range(20):  # 2 per second for 10 s
        window.arrived(100.0 + i / 2, output_tokens=1000)
    early = window.report(110.0, in_flight=3, queued=1)
    assert (early["window_s"], early["requests_per_second"], early["arrivals"]) == (10.0, 2.0, 20)
    assert (early["in_flight"], early["queued"]) == (3, 1)
    assert early["output_tokens"] == {"requests": 20, "sum": 20_000}
    late = window.report(160.0, in_flight=0, queued=0)  # every arrival is older than the window
    assert (late["window_s"], late["requests_per_second"], late["arrivals"]) == (30.0, 0.0, 0)


def test_a_steady_rate_reads_steady_and_memory_is_bounded_by_the_window() -> None:
    window = DemandWindow(started=0.0, window_s=30)
    for i in range(10_000):  # 5 per second for 2000 s
        window.arrived(i / 5, output_tokens=None)
        if i % 5 == 0:
            window.prompt_measured(i / 5, 2000)
    got = window.report(2000.0, in_flight=0, queued=0)
    assert abs(got["requests_per_second"] - 5.0) <= 5 / 30
    assert got["prompt_tokens"]["sum"] == 2000 * got["prompt_tokens"]["requests"]
    assert got["output_tokens"] == {"requests": 0, "sum": 0}
    assert len(window._buckets) <= 32


def test_lengths_come_only_from_well_formed_fields() -> None:
    assert asked_output_tokens({"max_tokens": 64}) == 64
    assert asked_output_tokens({"max_completion_tokens": 32, "max_tokens": 64}) == 32
    assert asked_output_tokens({"max_tokens": True}) is None
    assert asked_output_tokens({"max_tokens": "64"}) is None
    assert asked_output_tokens({}) is None
    assert reported_prompt_tokens({"usage": {"prompt_tokens": 12}}) == 12
    assert reported_prompt_tokens({"usage": {"prompt_tokens": -1}}) is None
    assert reported_prompt_tokens({"usage": None}) is None
    assert reported_prompt_tokens([]) is None
