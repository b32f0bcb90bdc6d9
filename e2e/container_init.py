"""First process of every container: bind the pod's files and volumes into place, then exec the command.

Runs inside the container's own mount namespace (`unshare --mount --propagation private`), so nothing it
mounts is visible outside. It opens every source before mounting anything: a volume mounted over, say,
/tmp would otherwise hide sources that live under /tmp (the agent's state directory). Sources are then
bound through /proc/self/fd, which keeps pointing at the opened file. Directories the container's
executables come from (this project, its venv, the Python install) are bound back in place if a volume
hid them, so `pdctl` keeps working whatever the pod mounts. Standard library only, run by path.

    python container_init.py '{"binds": [[source, target, read_only], ...], "keep": [dir, ...],
                               "cwd": dir}' ARGV...
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096


def _mount(libc: ctypes.CDLL, source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    if libc.mount(src, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def main(argv: list[str]) -> None:
    plan = json.loads(argv[1])
    command = argv[2:]
    executable = _resolve(command[0])  # before mounting: a volume may hide the PATH entry (its links don't)
    libc = ctypes.CDLL(None, use_errno=True)
    sources = [os.open(source, os.O_PATH | os.O_CLOEXEC) for source, _, _ in plan["binds"]]
    kept = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in plan["keep"]]
    cwd = os.open(plan["cwd"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for fd, (_, target, read_only) in zip(sources, plan["binds"], strict=True):
        _ensure_target(target, fd)
        _mount(libc, f"/proc/self/fd/{fd}", target, MS_BIND)
        if read_only:
            _mount(libc, None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)
    for path, fd in kept:
        if not _same_file(path, fd):  # a volume hid it: bind the original back at the same path
            os.makedirs(path, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{fd}", path, MS_BIND)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    if executable is None:
        sys.stderr.write(f"exec {command[0]}: executable file not found in $PATH\n")
        sys.exit(127)
    try:
        os.execv(executable, command)
    except OSError as err:  # as a runtime reports it: the message, exit code 126
        sys.stderr.write(f"exec {command[0]}: {err.strerror}\n")
        sys.exit(126)


def _ensure_target(target: str, fd: int) -> None:
    """A target inside an earlier volume (e.g. /tmp/x after /tmp) exists only in that volume: create it."""
    if os.path.lexists(target):
        return
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def _same_file(path: str, fd: int) -> bool:
    try:
        now, before = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino)


def _resolve(name: str) -> str | None:
    found = shutil.which(name)
    return os.path.realpath(found) if found else None


if __name__ == "__main__":
    main(sys.argv)
