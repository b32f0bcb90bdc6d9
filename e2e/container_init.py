"""First process of every container: give it its own /dev and sysfs device classes, bind the pod's files and
volumes into place, then exec the command.

Runs inside the container's own mount namespace (`unshare --mount --propagation private`), so nothing it
mounts is visible outside. /dev becomes a fresh tmpfs, as a container runtime makes it: the standard
nodes (null, zero, full, random, urandom, tty, pts, ptmx), a 64 MiB /dev/shm and the device nodes the
node's device plugins allocated to this container, nothing of the machine's own devices. /sys/class is
replaced by a tmpfs that binds the machine's classes back, except the device classes the node agent
emulates (drm, kfd, infiniband, ...), which come from a directory prepared for this container.

It opens every source before mounting anything: a volume mounted over, say, /tmp would otherwise hide
sources that live under /tmp (the agent's state directory). Sources are then bound through
/proc/self/fd, which keeps pointing at the opened file. Directories the container's executables come
from (this project, its venv, the Python install) are bound back in place if a volume hid them, so
`pdctl` keeps working whatever the pod mounts. Standard library only, run by path.

    python container_init.py '{"dev": [[source, target], ...], "sys_class": dir,
                               "binds": [[source, target, read_only], ...], "keep": [dir, ...],
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
MS_NOSUID = 2
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
STANDARD_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts")
DEV_SYMLINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1"}
DEV_SYMLINKS["stderr"] = "/proc/self/fd/2"
SHM_OPTIONS = "mode=1777,size=64m"  # a container runtime's default /dev/shm


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, flags: int, fstype: str | None = None, data: str = ""
) -> None:
    src = source.encode() if source is not None else None
    kind = fstype.encode() if fstype is not None else None
    if libc.mount(src, target.encode(), kind, flags, data.encode() or None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _bind(libc: ctypes.CDLL, fd: int, target: str) -> None:
    _ensure_target(target, fd)
    _mount(libc, f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
    os.close(fd)


def _open(path: str) -> int:
    return os.open(path, os.O_PATH | os.O_CLOEXEC)


def _private_dev(libc: ctypes.CDLL, devices: list[tuple[int, str]]) -> None:
    """A tmpfs /dev with the standard nodes, /dev/shm, and the allocated devices (opened beforehand)."""
    links = dict(DEV_SYMLINKS)
    standard = []
    for name in STANDARD_DEVICES:
        path = f"/dev/{name}"
        if os.path.islink(path):  # e.g. ptmx -> pts/ptmx
            links[name] = os.readlink(path)
        elif os.path.exists(path):
            standard.append((_open(path), path))
    _mount(libc, "tmpfs", "/dev", MS_NOSUID, "tmpfs", "mode=755,size=65536k")
    for fd, target in standard + devices:
        _bind(libc, fd, target)
    for name, link in links.items():
        os.symlink(link, f"/dev/{name}")
    os.mkdir("/dev/shm")
    _mount(libc, "shm", "/dev/shm", MS_NOSUID, "tmpfs", SHM_OPTIONS)


def _emulated_sys_class(libc: ctypes.CDLL, prepared: str) -> None:
    """/sys/class with the machine's classes bound back, except those the agent prepared for this container."""
    emulated = set(os.listdir(prepared))
    kept = sorted(set(os.listdir("/sys/class")) - emulated)
    binds = [(_open(f"/sys/class/{name}"), f"/sys/class/{name}") for name in kept]
    binds += [(_open(os.path.join(prepared, name)), f"/sys/class/{name}") for name in sorted(emulated)]
    _mount(libc, "tmpfs", "/sys/class", MS_NOSUID | MS_NOEXEC, "tmpfs", "mode=755,size=1024k")
    for fd, target in binds:
        _bind(libc, fd, target)


def main(argv: list[str]) -> None:
    plan = json.loads(argv[1])
    command = argv[2:]
    executable = _resolve(command[0])  # before mounting: a volume may hide the PATH entry (its links don't)
    libc = ctypes.CDLL(None, use_errno=True)
    devices = [(_open(source), target) for source, target in plan.get("dev", [])]
    sources = [_open(source) for source, _, _ in plan["binds"]]
    kept = [(path, _open(path)) for path in plan["keep"]]
    cwd = os.open(plan["cwd"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if "dev" in plan:
        _private_dev(libc, devices)
    if plan.get("sys_class"):
        _emulated_sys_class(libc, plan["sys_class"])
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
