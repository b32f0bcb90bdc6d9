"""Start and stop the harness's own processes, identified by pid AND start time.

A bare pid can be reused by an unrelated process after ours exits; recording the kernel's start time
(field 22 of /proc/<pid>/stat) lets `stop` refuse to signal anything it did not start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcRef:
    """A process this harness started."""

    name: str
    pid: int
    start_ticks: int

    def as_dict(self) -> dict[str, str | int]:
        return {"name": self.name, "pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_dict(cls, data: dict[str, str | int]) -> ProcRef:
        return cls(name=str(data["name"]), pid=int(data["pid"]), start_ticks=int(data["start_ticks"]))


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22 overall; fields[0] is field 3 (state)


def is_running(ref: ProcRef) -> bool:
    ticks = start_ticks(ref.pid)
    if ticks != ref.start_ticks:
        return False
    state = Path(f"/proc/{ref.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def die_with_parent() -> None:
    """preexec hook: the child gets SIGKILL when the harness process dies, so nothing is left behind."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    name: str,
    argv: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    detach: bool = False,
    cgroups: Sequence[Path] = (),
) -> tuple[ProcRef, subprocess.Popen[bytes]]:
    """Start `argv` in its own session with output to `log_path`, in `cgroups` (their cgroup.procs files)
    from its first instruction on, so everything it forks is there too.

    detach=False ties the child's life to ours (pytest); detach=True leaves it running (make cluster-up).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def before_exec() -> None:
        for procs in cgroups:
            procs.write_text(str(os.getpid()))
        if not detach:
            die_with_parent()

    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=before_exec,
        )
    ticks = start_ticks(popen.pid)
    return ProcRef(name=name, pid=popen.pid, start_ticks=ticks or 0), popen


def stop(ref: ProcRef, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; a no-op for processes that are gone or not ours."""
    if not is_running(ref):
        _reap(ref.pid)
        return
    os.kill(ref.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(ref.pid)
        if not is_running(ref):
            return
        time.sleep(0.05)
    if is_running(ref):
        os.kill(ref.pid, signal.SIGKILL)
    for _ in range(100):
        _reap(ref.pid)
        if not is_running(ref):
            return
        time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
