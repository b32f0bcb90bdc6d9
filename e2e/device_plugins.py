"""Start the fake MI300X node's device plugins next to a real kubelet.

`pd-fake-device-plugins` (e2e/tools/devplugins, built by e2e/build-device-plugins.sh) makes the node's
device nodes (real character devices: /dev/kfd, /dev/dri/card*/renderD*, /dev/infiniband/*) and its
sysfs device classes under `devices_root`, then registers amd.com/gpu, rdma/hca_shared_devices_a and
amd.com/nic on the kubelet's device-plugin socket and serves Allocate from there: the kubelet's device
manager, containerd and runc put the devices into containers as on a GPU node (docs/gpu-allocation.md,
"The fake devices of the e2e node").
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e.node_config import NODE_KUBELET_ROOT, NodeLayout
from e2e.procs import ProcRef, spawn

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "build-device-plugins.sh"
BINARY = "pd-fake-device-plugins"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"  # pluginapi.DevicePluginPath, fixed in the kubelet


def binary(name: str = BINARY) -> Path:
    """A binary of e2e/tools/devplugins (the device plugins, the DRA driver): in $PD_E2E_DEVPLUGINS (a
    directory of them built before), else where the build script keeps them in its cache."""
    if env_dir := os.environ.get("PD_E2E_DEVPLUGINS"):
        return Path(env_dir) / name
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1]) / name


@dataclass(frozen=True)
class NodeDevicesSpec:
    """What the node has: `nics=0` leaves out the RDMA resources; `uverbs=False` is a misconfigured node
    without ib_uverbs, whose RDMA resources stay advertised but hand out no /dev/infiniband/uverbs*."""

    gpus: int = 8
    nics: int = 8
    numa_nodes: int = 2
    uverbs: bool = True

    def argv(self, kubelet_root: Path, devices_root: Path) -> list[str]:
        return [
            f"-dir={kubelet_root / 'device-plugins'}",
            f"-root={devices_root}",
            f"-gpus={self.gpus}",
            f"-nics={self.nics}",
            f"-numa-nodes={self.numa_nodes}",
            *([] if self.uverbs else ["-no-uverbs"]),
        ]


def kubelet_wrapper(kubelet_root: Path) -> list[str]:
    """The argv prefix that runs a kubelet where it finds `kubelet_root`'s device-plugins directory: its
    device manager listens on /var/lib/kubelet/device-plugins/kubelet.sock whatever --root-dir says, so
    the kubelet gets a mount namespace of its own, a tmpfs on /var/lib (nothing appears in the machine's)
    and the node's directory bound there; several kubelets on one machine then keep their plugins apart."""
    plugins = kubelet_root / "device-plugins"
    script = (
        "set -e; mount --make-rprivate /; mount -t tmpfs -o size=1m,mode=755 pd-node-varlib /var/lib; "
        f'mkdir -p {DEVICE_PLUGIN_PATH}; mount --bind "$0" {DEVICE_PLUGIN_PATH}; exec "$@"'
    )
    return ["unshare", "--mount", "sh", "-c", script, str(plugins)]


def start(
    kubelet_root: Path, devices_root: Path, log_path: Path, spec: NodeDevicesSpec | None = None, detach: bool = False
) -> ProcRef:
    """Start the plugins of the kubelet whose --root-dir is `kubelet_root`; they register whenever its
    kubelet.sock appears (again after each kubelet restart). Stop them with procs.stop."""
    (kubelet_root / "device-plugins").mkdir(parents=True, exist_ok=True)
    argv = [str(binary()), *(spec or NodeDevicesSpec()).argv(kubelet_root, devices_root)]
    ref, _ = spawn("device-plugins", argv, log_path, detach=detach)
    return ref


def real_node_plugin(spec: NodeDevicesSpec | None = None) -> Callable[[NodeLayout], list[str]]:
    """The plugins as a real node's plugin (`Stack.start_real_node(plugins={"devices": ...})`): in the node's
    mount namespace its kubelet directory is at the fixed path (no `kubelet_wrapper`), and the device
    tree goes into the node's directory, so it goes with the node."""
    path = str(binary())
    devices = spec or NodeDevicesSpec()
    return lambda layout: [path, *devices.argv(Path(NODE_KUBELET_ROOT), Path(layout.root) / "devices")]
