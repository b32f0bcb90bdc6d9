"""The fake device plugins' own tests (Go): registration on kubelet.sock, ListAndWatch with NUMA topology,
GetPreferredAllocation's contiguous ranges, Allocate's device nodes, re-registration after a kubelet
restart, the device tree (mknod needs root)."""

from __future__ import annotations

import os
import subprocess

from e2e.device_plugins import REPO_ROOT


def test_go_tests_of_the_device_plugins_pass() -> None:
    module = REPO_ROOT / "e2e" / "tools" / "devplugins"
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    done = subprocess.run(
        ["nice", "-n", "10", "go", "test", "./..."], cwd=module, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
