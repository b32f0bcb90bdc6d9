"""Canary: a tiny request through P->D at start and at an interval, reported in /status.

Readiness can then mean "a KV transfer really succeeded", not only "processes answer" (llm-d users
report silent decode-only operation). An answer from prefill alone does not count as success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC, datetime

import aiohttp

from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.flows import ProxyCore
from pd_runtime.proxy.legs import ClientRequest
from pd_runtime.proxy.sinks import BufferSink
from pd_runtime.proxy.status import CanaryState

log = logging.getLogger(__name__)


class Canary:
    def __init__(self, core: ProxyCore, config: ProxyConfig) -> None:
        self.core = core
        self.config = config
        self.state = CanaryState(enabled=config.canary_interval_s > 0)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.state.enabled:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(self.config.canary_interval_s)

    async def run_once(self) -> CanaryState:
        error = await self._probe()
        self.state = CanaryState(enabled=self.state.enabled, ok=error is None, at=datetime.now(UTC), error=error)
        self.core.metrics.canary_ok.set(1 if error is None else 0)
        if error is not None:
            log.warning("canary failed: %s", error)
        return self.state

    async def _probe(self) -> str | None:
        """None when one tiny request went through and (disaggregated) both legs of its transfer succeeded."""
        model = self.config.canary_model or await self._first_model()
        if model is None:
            return "no live decode engine lists a model"
        body = {"model": model, "prompt": self.config.canary_prompt, "max_tokens": 2, "stream": False}
        sink = BufferSink()
        result = await self.core.handle(ClientRequest("completions", body), sink, source="canary")
        if sink.status != 200:
            return f"HTTP {sink.status}: {sink.body[:200].decode(errors='replace')}"
        if self.config.mode == "disaggregated" and not result.verified_transfer:
            return "the request was served without a verified P->D KV transfer"
        return None

    async def _first_model(self) -> str | None:
        now = time.monotonic()
        live = (
            self.core.registry.live("D", now)
            if self.config.mode == "disaggregated"
            else self.core.registry.live(None, now)
        )
        if not live or self.core.session is None:
            return None
        headers = {"Authorization": f"Bearer {self.config.engine_api_key}"} if self.config.engine_api_key else {}
        try:
            async with asyncio.timeout(self.config.timeouts.health):
                async with self.core.session.get(f"{live[0].base_url}/v1/models", headers=headers) as resp:
                    document = json.loads(await resp.read())
            model = document["data"][0]["id"]
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
            return None
        return model if isinstance(model, str) else None
