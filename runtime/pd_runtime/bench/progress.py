"""A one-line progress bar on stderr for long runs (only on a terminal, never with --quiet)."""

from __future__ import annotations

import time
from typing import Protocol, TextIO

from pd_runtime.bench.slo import RequestTiming

BAR_WIDTH = 24
MIN_REDRAW_S = 0.1


class StageProgress(Protocol):
    def advance(self, timing: RequestTiming) -> None: ...

    def close(self) -> None: ...


class ProgressFactory(Protocol):
    def __call__(self, label: str, total: int) -> StageProgress: ...


class SilentProgress:
    def advance(self, timing: RequestTiming) -> None:
        return None

    def close(self) -> None:
        return None


class BarProgress:
    """Counts finished requests (warm-up included: they take time too) and failures so far."""

    def __init__(self, stream: TextIO, label: str, total: int) -> None:
        self._stream = stream
        self._label = label
        self._total = max(total, 1)
        self._done = 0
        self._failed = 0
        self._started = time.monotonic()
        self._drawn_at = 0.0
        self._draw()

    def advance(self, timing: RequestTiming) -> None:
        self._done += 1
        self._failed += timing.error is not None
        now = time.monotonic()
        if now - self._drawn_at >= MIN_REDRAW_S or self._done == self._total:
            self._draw()

    def close(self) -> None:
        self._draw()
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self) -> None:
        self._drawn_at = time.monotonic()
        filled = BAR_WIDTH * self._done // self._total
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = self._drawn_at - self._started
        self._stream.write(f"\r{self._label} [{bar}] {self._done}/{self._total} failed {self._failed} {elapsed:6.1f}s")
        self._stream.flush()


def progress_factory(stream: TextIO, enabled: bool) -> ProgressFactory:
    def make(label: str, total: int) -> StageProgress:
        return BarProgress(stream, label, total) if enabled else SilentProgress()

    return make
