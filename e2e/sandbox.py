"""A pod's sandbox on the agent's host: directory, network namespace, volumes, hosts file, launch argv.

Containers share the pod's network namespace (as in Kubernetes) and each runs in its own private mount
namespace with its own /dev (the devices allocated to it) and emulated sysfs device classes, where the
pod's hosts file, its termination-message file and its volumes are bind-mounted at the paths the spec
names. Memory-backed emptyDirs are one tmpfs per pod, shared by every container that mounts it, as the
kubelet does. hostPath volumes name paths of the emulated node's filesystem (a directory of the agent),
never the machine's: /dev/... there holds the node's device files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from e2e import configmaps, devices
from e2e.devices import Allocation, ContainerView, NodeDevices
from e2e.podspec import ConfigError, MountPlan, VolumePlan

log = logging.getLogger(__name__)

TERMINATION_LOG = "/dev/termination-log"
CONTAINER_INIT = Path(__file__).with_name("container_init.py")
# where the containers' executables live (project, venv, Python): kept visible whatever a pod mounts
KEEP_VISIBLE = sorted({str(Path(p).resolve()) for p in (CONTAINER_INIT.parent.parent, sys.prefix, sys.base_prefix)})
TokenFetcher = Callable[[str, int], Awaitable[str]]  # (audience, expirationSeconds) -> token
_MUST_EXIST = {"Directory", "File", "Socket", "CharDevice", "BlockDevice"}


class MountPoints:
    """Creates missing mount targets on the host and removes them when the agent stops.

    A bind mount needs an existing target; the agent creates it once and never removes it while any pod may
    still use it (rmdir of a mount point in another namespace would detach that mount).
    """

    def __init__(self) -> None:
        self._created: list[Path] = []

    def ensure(self, target: Path, is_file: bool) -> None:
        missing = []
        parent = target if not is_file else target.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            directory.mkdir()
            self._created.append(directory)
        if is_file and not target.exists():
            target.touch()
            self._created.append(target)

    def cleanup(self) -> None:
        for path in reversed(self._created):
            try:
                path.unlink() if path.is_file() else path.rmdir()
            except OSError as err:
                log.warning("could not remove mount point %s: %s", path, err)
        self._created.clear()


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {err.decode().strip()}")


class PodSandbox:
    """Host-side state of one pod: files under `root`, optional network namespace, volumes."""

    def __init__(self, root: Path, mount_points: MountPoints, host_root: Path) -> None:
        self.root = root
        self.netns = ""
        self.ip = ""
        self._mount_points = mount_points
        self._host_root = host_root
        self._volumes: dict[str, Path] = {}
        self._tmpfs: list[Path] = []

    @property
    def volumes(self) -> dict[str, Path]:
        """Materialized volumes by name (their host directories)."""
        return self._volumes

    @property
    def hosts_file(self) -> Path:
        return self.root / "hosts"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    def container_dir(self, name: str) -> Path:
        path = self.root / "containers" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def termination_file(self, name: str) -> Path:
        return self.container_dir(name) / "termination-log"

    async def create_volumes(self, plans: list[VolumePlan], fetch_token: TokenFetcher) -> None:
        for plan in plans:
            if plan.name in self._volumes:
                continue
            self._volumes[plan.name] = await self._materialize(plan, fetch_token)

    async def _materialize(self, plan: VolumePlan, fetch_token: TokenFetcher) -> Path:
        if plan.kind == "hostPath":
            return self._host_path(plan)
        path = self.root / "volumes" / plan.name
        path.mkdir(parents=True, exist_ok=True)
        if plan.kind == "tmpfs":
            size = f",size={plan.size_bytes}" if plan.size_bytes else ""
            await _run("mount", "-t", "tmpfs", "-o", f"mode=1777{size}", f"pd-e2e-{plan.name}", str(path))
            self._tmpfs.append(path)
        if plan.kind == "files":
            configmaps.write_atomic(path, plan.files)  # the kubelet's layout, so updates can swap in
        for audience, expiration_s, rel in plan.token_requests:
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(await fetch_token(audience, expiration_s))
            target.chmod(0o600)
        return path

    def _host_path(self, plan: VolumePlan) -> Path:
        """The emulated node's path: tests never touch the machine's own files or devices."""
        path = self._host_root / plan.host_path.lstrip("/")
        if path.exists():
            return path
        if plan.host_path_type in _MUST_EXIST:
            raise ConfigError(f"hostPath type check failed: {plan.host_path} is not a {plan.host_path_type}")
        if plan.host_path_type == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True)
        return path

    def sys_class_dir(self, container: str, node: NodeDevices, visible: Allocation) -> Path:
        """The emulated sysfs device classes this container sees, written afresh for every start."""
        path = self.container_dir(container) / "sys-class"
        shutil.rmtree(path, ignore_errors=True)
        devices.write_sys_class(path, node, visible)
        return path

    def write_resolv_conf(self, namespace: str) -> None:
        """Search domains as in a cluster; the nameserver is the pod's own loopback, which answers
        at once with "refused", so lookups of unknown names fail fast instead of timing out."""
        search = f"{namespace}.svc.cluster.local svc.cluster.local cluster.local"
        self.resolv_conf.write_text(f"search {search}\nnameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n")

    def write_hosts(self, content: str) -> None:
        """Rewrite the hosts file in place: bind mounts follow the inode, so running pods see the update."""
        if self.hosts_file.exists():
            with self.hosts_file.open("r+") as handle:
                handle.seek(0)
                handle.write(content)
                handle.truncate()
        else:
            self.hosts_file.write_text(content)

    def launch_argv(
        self,
        container: str,
        mounts: list[MountPlan],
        argv: list[str],
        workdir: str,
        view: ContainerView,
        sys_class: Path,
    ) -> list[str]:
        """The argv that runs `argv` inside the pod's network namespace and a private mount namespace."""
        binds = [(self.hosts_file, Path("/etc/hosts"), False), (self.resolv_conf, Path("/etc/resolv.conf"), True)]
        binds.append((self.termination_file(container), Path(TERMINATION_LOG), False))
        for mount in sorted(mounts, key=lambda m: len(Path(m.target).parts)):
            source = self._volumes[mount.volume]
            if mount.sub_path:
                source = source / mount.sub_path
                if not source.exists():
                    source.mkdir(parents=True)
            binds.append((source, Path(mount.target), mount.read_only))
        for source, target, _ in binds:
            if not target.is_relative_to("/dev"):  # the container's /dev is its own tmpfs
                self._mount_points.ensure(target, is_file=source.is_file())
        cwd = workdir if workdir and Path(workdir).is_dir() else str(self.container_dir(container))
        plan = {
            "dev": [[str(source), target] for source, target in view.devices],
            "sys_class": str(sys_class),
            "binds": [[str(s), str(t), ro] for s, t, ro in binds],
            "keep": KEEP_VISIBLE,
            "cwd": cwd,
        }
        wrapped = ["unshare", "--mount", "--propagation", "private", "--"]
        wrapped += [sys.executable, "-S", "-E", str(CONTAINER_INIT), json.dumps(plan), *argv]
        return ["ip", "netns", "exec", self.netns, *wrapped] if self.netns else wrapped

    async def destroy(self, keep_files: bool) -> None:
        for path in self._tmpfs:
            await _run("umount", "-l", str(path))
        self._tmpfs.clear()
        if not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)


def unmount_leftovers(under: Path) -> None:
    """Lazy-unmount every mount below `under` (a crashed agent's tmpfs volumes)."""
    prefix = str(under.resolve()) + os.sep
    with open("/proc/self/mounts") as mounts:
        targets = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)
