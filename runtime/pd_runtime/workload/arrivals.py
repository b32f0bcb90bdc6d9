"""Pure: open-loop arrival times for one stage.

Arrivals are fixed before the stage starts and never wait for responses, so an overloaded server
builds a queue instead of slowing the client down (a closed loop would hide exactly the overload the
SLO is about).
"""

from __future__ import annotations

import random
from enum import StrEnum


class Arrival(StrEnum):
    POISSON = "poisson"
    CONSTANT = "constant"


def arrival_offsets(count: int, rate: float, process: Arrival, rng: random.Random) -> list[float]:
    """Send times in seconds from the stage start; the first request goes at 0.

    Poisson: exponential gaps with mean 1/rate (not rescaled to a fixed span, unlike vLLM's bench, so
    it is a true Poisson process). Constant: evenly spaced at 1/rate.
    """
    if count < 0 or rate <= 0:
        raise ValueError(f"need count >= 0 and rate > 0, got {count} and {rate}")
    offsets: list[float] = []
    now = 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate) if process is Arrival.POISSON else 1.0 / rate
        offsets.append(now)
    return offsets


def stage_rng(seed: int, rate: float, purpose: str) -> random.Random:
    """A generator that depends only on (seed, rate, purpose): the same rate gets the same arrivals
    and prompts in a single-rate run, a sweep or a search, so configurations compare point by point."""
    return random.Random(f"{seed}/{rate!r}/{purpose}")
