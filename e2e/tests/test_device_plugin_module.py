"""The fake device plugins' own tests (Go): registration on kubelet.sock, ListAndWatch with NUMA topology,
GetPreferredAllocation's contiguous ranges, Allocate's device nodes, re-registration after a kubelet
restart, the device tree (mknod needs root); the fake DRA driver's (registration, NodePrepareResources
and NodeUnprepareResources over gRPC, the published ResourceSlice); and the kubelet's mount namespace
for its fixed socket path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from e2e.device_plugins import DEVICE_PLUGIN_PATH, REPO_ROOT, kubelet_wrapper


def test_go_tests_of_the_device_plugins_pass() -> None:
    module = REPO_ROOT / "e2e" / "tools" / "devplugins"
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    done = subprocess.run(
        ["nice", "-n", "10", "go", "test", "./..."], cwd=module, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_kubelet_wrapper_shows_the_nodes_plugin_directory_at_the_fixed_path(tmp_path: Path) -> None:
    plugins = tmp_path / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    (plugins / "pd-fake-amd-gpu.sock").touch()
    argv = [*kubelet_wrapper(tmp_path / "kubelet"), "ls", DEVICE_PLUGIN_PATH]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pd-fake-amd-gpu.sock"]
