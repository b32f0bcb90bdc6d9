"""Watches the settings file (``--config-file``) and applies a changed content, or refuses it.

The kubelet updates a mounted ConfigMap by writing the new files into a fresh directory and swapping
the ``..data`` symlink onto it, so a reader of the path sees either the whole old or the whole new
content. Polling the content (a few hundred bytes, every ``--config-poll-interval`` seconds) catches
every such swap; an inotify watch on the path would follow the old target, which the swap deletes, and
need re-arming after each one. An unchanged content is not evaluated again, so a refused file is logged
and counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pd_runtime.proxy import reload
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.reload import Refusal, ReloadState

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


class SettingsWatcher:
    """Reads the file, keeps the reload state for /status and the metrics."""

    def __init__(self, base: ProxyConfig, metrics: ProxyMetrics, clock: Callable[[], datetime] = _now) -> None:
        assert base.config_file is not None
        self.base = base
        self.path = Path(base.config_file)
        self.metrics = metrics
        self.clock = clock
        self.state = ReloadState(file=base.config_file)
        self._seen: bytes | str | None = None  # the last content read, or the last read error
        self._task: asyncio.Task[None] | None = None

    def initial(self) -> ProxyConfig:
        """The configuration to start with: the flags merged with the file, or the flags alone if refused."""
        return self.check() or self.base

    def check(self) -> ProxyConfig | None:
        """Read the file once; if its content changed, the configuration it gives (None: unchanged or refused)."""
        try:
            content: bytes | str = self.path.read_bytes()
        except OSError as exc:
            content = f"cannot read {self.path}: {exc.strerror or exc}"
        if content == self._seen:
            return None
        self._seen = content
        if isinstance(content, str):
            self._refuse("", content)
            return None
        outcome = reload.evaluate(self.base, content)
        if outcome.config is None:
            self._refuse(reload.digest(content), outcome.reason)
            return None
        self.state = self.state.applied_content(reload.digest(content), self.clock())
        self.metrics.config_reloads.labels("applied").inc()
        self.metrics.config_refused.set(0)
        log.info(
            "settings file applied file=%s digest=%s settings=%s",
            self.path,
            self.state.digest,
            reload.current_values(outcome.config),
        )
        return outcome.config

    def _refuse(self, content_digest: str, reason: str) -> None:
        self.state = self.state.refused_content(Refusal(content_digest, self.clock(), reason))
        self.metrics.config_reloads.labels("refused").inc()
        self.metrics.config_refused.set(1)
        log.error("settings file refused, keeping the running settings file=%s reason=%s", self.path, reason)

    def start(self, apply: Callable[[ProxyConfig], None]) -> None:
        """Poll the file every ``--config-poll-interval`` seconds; ``apply`` gets each accepted configuration."""
        self._task = asyncio.create_task(self._loop(apply))

    async def _loop(self, apply: Callable[[ProxyConfig], None]) -> None:
        while True:
            await asyncio.sleep(self.base.config_poll_interval_s)
            config = self.check()
            if config is not None:
                apply(config)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
