"""The event loop a pdctl tool runs on: uvloop when installed (the `fast` extra), else asyncio's.

uvloop shortens the time from a chunk's arrival on the socket to the bench's timestamp (docs/benchmarks.md,
"Bench client timing error") and cuts the proxy's cost per relayed chunk, so the bench, the proxy and the
benchmarks use it whenever it is there. Asking for it by name without the extra raises
ModuleNotFoundError, which `pdctl` reports as the missing `fast` extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopChoice = Literal["auto", "asyncio", "uvloop"]
LOOP_CHOICES: tuple[LoopChoice, ...] = ("auto", "asyncio", "uvloop")


def run(main: Coroutine[Any, Any, T], choice: LoopChoice = "auto") -> T:
    """Run ``main`` to completion; "auto" picks uvloop when it is importable."""
    if choice != "asyncio":
        try:
            import uvloop
        except ModuleNotFoundError:
            if choice == "uvloop":
                main.close()  # never started: no "coroutine was never awaited" warning
                raise
        else:
            result: T = uvloop.run(main)  # typed here: without the `fast` extra mypy sees uvloop as Any
            return result
    return asyncio.run(main)


def loop_name() -> str:
    """What "auto" runs on, with uvloop's version, for the machine line of a report."""
    try:
        return f"uvloop {version('uvloop')}"
    except PackageNotFoundError:
        return "asyncio"
