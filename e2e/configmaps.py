"""ConfigMap, Secret and downward-API volumes written and refreshed as the kubelet does.

The kubelet's atomic writer (pkg/volume/util/atomic_writer.go) keeps a volume's files in a timestamped
directory ``..<timestamp>``, points the symlink ``..data`` at it, and exposes each top-level name as a
symlink ``name -> ..data/name``. An update writes a new timestamped directory, points ``..data_tmp`` at
it and renames that over ``..data`` (one atomic rename), then adds or removes the top-level links and
deletes the old directory: a reader of ``name`` sees the whole old or the whole new content, never a
mix. Running containers see the change because the volume directory itself is bind-mounted (a subPath
mount binds one file and never sees updates, as in Kubernetes).

The kubelet re-syncs mounted volumes every sync period (1 min by default, plus its ConfigMap cache
TTL); the agent does it every ``SYNC_PERIOD_S`` so tests wait seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from e2e.podspec import ConfigError, Refs, VolumeFile, VolumePlan

log = logging.getLogger(__name__)

DATA_LINK = "..data"
SYNC_PERIOD_S = 1.0


def _payload(files: Sequence[VolumeFile]) -> dict[str, tuple[str, int]]:
    return {f.path: (f.content, f.mode) for f in files}


def current_payload(directory: Path) -> dict[str, tuple[str, int]] | None:
    """The files the volume shows now (None: never written by the atomic writer)."""
    data = directory / DATA_LINK
    if not data.is_symlink():
        return None
    root = data.resolve()
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(root))] = (path.read_text(), path.stat().st_mode & 0o7777)
    return found


def write_atomic(directory: Path, files: Sequence[VolumeFile]) -> bool:
    """Make ``directory`` show exactly ``files``; False when it already does (nothing is touched)."""
    wanted = _payload(files)
    if current_payload(directory) == wanted:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S.%f")
    fresh = directory / f"..{stamp}"
    fresh.mkdir()
    for rel, (content, mode) in wanted.items():
        target = fresh / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
    data = directory / DATA_LINK
    old = data.resolve() if data.is_symlink() else None
    tmp = directory / f"{DATA_LINK}_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(fresh.name)
    os.replace(tmp, data)  # the one atomic step: readers switch from the old directory to the new one
    _relink(directory, {Path(rel).parts[0] for rel in wanted})
    if old is not None and old != fresh:
        shutil.rmtree(old, ignore_errors=True)
    return True


def _relink(directory: Path, names: set[str]) -> None:
    """Top-level ``name -> ..data/name`` links for the new payload; links of removed names go."""
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in names:
            entry.unlink()
    for name in names:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_LINK}/{name}")


def refreshable(plan: VolumePlan) -> bool:
    """Volumes whose files follow their source objects (tokens are requested once, at start, here)."""
    return plan.kind == "files" and not plan.token_requests


class VolumeRefresher:
    """Re-reads a pod's ConfigMaps and Secrets every period and rewrites the volumes that changed."""

    def __init__(
        self,
        fetch_refs: Callable[[], Awaitable[Refs]],
        plan_volumes: Callable[[Refs], list[VolumePlan]],
        volumes: Mapping[str, Path],
        period_s: float = SYNC_PERIOD_S,
    ) -> None:
        self.fetch_refs = fetch_refs
        self.plan_volumes = plan_volumes
        self.volumes = volumes
        self.period_s = period_s

    async def sync_once(self) -> list[str]:
        """The names of the volumes rewritten."""
        plans = self.plan_volumes(await self.fetch_refs())
        changed = []
        for plan in plans:
            if refreshable(plan) and plan.name in self.volumes and write_atomic(self.volumes[plan.name], plan.files):
                changed.append(plan.name)
        return changed

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                changed = await self.sync_once()
            except ConfigError as err:  # e.g. the ConfigMap was deleted: the kubelet keeps the last content
                log.info("volume refresh skipped: %s", err)
                continue
            except Exception as err:
                log.warning("volume refresh failed: %s", err)
                continue
            if changed:
                log.info("volumes updated: %s", ", ".join(changed))
