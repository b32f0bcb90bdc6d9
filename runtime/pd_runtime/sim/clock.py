"""Model time on a real clock: ``--time-scale X`` runs every modelled duration X times faster."""

from __future__ import annotations

import asyncio
import time


class ScaledClock:
    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._origin = time.monotonic()

    def now(self) -> float:
        """Model seconds since the clock started."""
        return (time.monotonic() - self._origin) * self.scale

    def wall(self, model_seconds: float) -> float:
        """Real seconds a model duration takes."""
        return model_seconds / self.scale

    async def sleep_until(self, model_time: float) -> None:
        """Sleep to an absolute model time, so step durations never accumulate drift; always yields."""
        await asyncio.sleep(max(0.0, self.wall(model_time - self.now())))
