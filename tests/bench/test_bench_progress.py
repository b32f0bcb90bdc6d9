"""The progress bar: one redrawn line on its stream, counting failures."""

from __future__ import annotations

import io

from pd_runtime.bench.progress import BarProgress, SilentProgress, progress_factory
from pd_runtime.bench.slo import RequestTiming


def timing(error: str | None = None) -> RequestTiming:
    return RequestTiming(index=0, request_id="r", warmup=False, scheduled_s=0, sent_s=0, end_s=1, error=error)


def test_bar_counts_and_ends_with_a_newline() -> None:
    stream = io.StringIO()
    bar = BarProgress(stream, "8 req/s", total=3)
    for error in (None, "timeout: x", None):
        bar.advance(timing(error))
    bar.close()
    last_line = stream.getvalue().split("\r")[-1]
    assert last_line.startswith("8 req/s [") and "3/3 failed 1" in last_line
    assert stream.getvalue().endswith("\n")


def test_disabled_progress_writes_nothing() -> None:
    stream = io.StringIO()
    progress = progress_factory(stream, enabled=False)("x", 10)
    assert isinstance(progress, SilentProgress)
    progress.advance(timing())
    progress.close()
    assert stream.getvalue() == ""
