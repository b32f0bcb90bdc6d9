"""Fixtures for the bench tests: the calibration server on a free loopback port, on its own thread.

Its own thread and event loop, because `pdctl bench` (cli.main) runs its own asyncio loop, as it does
for a user; the two never share a loop, so the client's timing is measured as in real use.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from pd_runtime.bench.calibration_server import Behaviour, CalibrationServer

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "runtime" / "pd_runtime" / "bench"


class ServerThread:
    def __init__(self, behaviour: Behaviour) -> None:
        self.server = CalibrationServer(behaviour)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def calibration_server() -> Iterator[Callable[[Behaviour], ServerThread]]:
    started: list[ServerThread] = []

    def start(behaviour: Behaviour) -> ServerThread:
        started.append(ServerThread(behaviour))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text())
    return loaded


@pytest.fixture(scope="session")
def validators() -> dict[str, Draft202012Validator]:
    """Validators for the two documents; the result schema refers to the summary schema by $id."""
    summary, result = _schema("summary.schema.json"), _schema("result.schema.json")
    registry: Registry[Any] = Registry().with_resources(
        [(s["$id"], Resource.from_contents(s)) for s in (summary, result)]
    )
    Draft202012Validator.check_schema(summary)
    Draft202012Validator.check_schema(result)
    return {
        "summary": Draft202012Validator(summary, registry=registry),
        "result": Draft202012Validator(result, registry=registry),
    }
