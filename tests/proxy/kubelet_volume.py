"""A ConfigMap volume as the kubelet's AtomicWriter updates it, for tests of a reader of mounted files.

The kubelet writes each new payload into a fresh timestamped directory, swaps the `..data` symlink to it
in one rename, keeps one top-level link per key (`name -> ..data/name`) and removes the old directory: a
reader sees the old content or the new, never a mix (the e2e tier's `test_proxy_reload.py` has the real
kubelet do it)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

DATA_LINK = "..data"


def publish(volume: Path, name: str, content: str) -> Path:
    """Make ``volume`` hold the one key ``name`` with ``content``; returns the path a reader opens."""
    volume.mkdir(parents=True, exist_ok=True)
    fresh = volume / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    fresh.mkdir()
    (fresh / name).write_text(content)
    data = volume / DATA_LINK
    old = data.resolve() if data.is_symlink() else None
    staged = volume / f"{DATA_LINK}_tmp"
    staged.unlink(missing_ok=True)
    staged.symlink_to(fresh.name)
    os.replace(staged, data)  # the one atomic step
    link = volume / name
    if not link.is_symlink():
        link.symlink_to(f"{DATA_LINK}/{name}")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return link
