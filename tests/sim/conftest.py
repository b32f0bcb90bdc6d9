"""Fixtures of the simulator tests (helpers live in sim_helpers, a uniquely named module)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from pd_runtime.sim.config import parse_args
from pd_runtime.sim.engine import SimEngine
from pd_runtime.sim.profiles import get_profile
from pd_runtime.sim.server import build_app
from pd_runtime.sim.stack import LocalStack
from tests.sim.sim_helpers import EngineFactory, RunningEngine


@pytest.fixture
async def start_engine() -> AsyncIterator[EngineFactory]:
    """Factory: ``await start_engine(argv)`` runs a SimEngine and its HTTP server in this event loop."""
    running: list[RunningEngine] = []

    async def start(argv: list[str]) -> RunningEngine:
        config = parse_args(argv, env={})
        engine = SimEngine(config, get_profile(config.profile))
        await engine.start()
        runner = web.AppRunner(build_app(engine), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", config.port).start()
        item = RunningEngine(engine, runner, f"http://127.0.0.1:{config.port}")
        running.append(item)
        return item

    yield start
    for item in running:
        await item.stop()


@pytest.fixture
def stacks() -> Iterator[list[LocalStack]]:
    """Local stacks (real processes) a test launched; each is stopped, by pid, at the end."""
    started: list[LocalStack] = []
    yield started
    for stack in started:
        stack.stop()
