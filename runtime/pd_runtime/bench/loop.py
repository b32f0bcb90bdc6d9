"""The event loop the bench runs on: uvloop when installed (the `fast` extra), else asyncio's.

uvloop shortens the time from a chunk's arrival on the socket to the bench's timestamp (measured in
docs/benchmarks.md, "Bench client timing error"), so it is used whenever it is there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)  # typed here: without the `fast` extra mypy sees uvloop as Any
    return result


def loop_name() -> str:
    try:
        return f"uvloop {version('uvloop')}"
    except PackageNotFoundError:
        return "asyncio"
