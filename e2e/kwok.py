"""Fake MI300X nodes played by KWOK (sigs.k8s.io/kwok v0.8.0) on a ControlPlane: for scale runs, where
pods only need to be scheduled and become Running and Ready, not run (benchmarks/operator_scale.py).

`kwok` is built with the control plane (`e2e/build-control-plane.sh --kwok`, or
`binaries_dir("--kwok")`: ~/.cache/pd-operator-e2e/bin-kwok-v0.8.0, linked into the bin directory) and
runs as one process against the admin kubeconfig, recorded in the control plane's processes, so
`ControlPlane.stop` (and `Stack.down`) stops it. What it is given (its stages, the Nodes) is
e2e/kwok_config.py.

    ref, nodes = kwok.start(cp, count=2)   # Nodes kwok-mi300x-0, -1 created; then wait until each is Ready
"""

from __future__ import annotations

import logging
import os

import yaml

from e2e import kwok_config
from e2e.cluster import ControlPlane
from e2e.node_config import MI300X_SERVER, MachineShape
from e2e.procs import ProcRef, spawn

log = logging.getLogger(__name__)

PROC_NAME = "kwok"


def start(
    cp: ControlPlane, count: int, shape: MachineShape = MI300X_SERVER, detach: bool = False
) -> tuple[ProcRef, list[str]]:
    """Start `kwok` (needs `cp.bin_dir` from `binaries_dir("--kwok")`) and create `count` fake nodes of
    `shape`; returns its process and the nodes' names (not yet waited for: KWOK makes them Ready)."""
    binary = cp.bin_dir / "kwok"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is missing: the control plane's binaries_dir('--kwok') builds it")
    config = cp.workdir / "kwok.yaml"
    config.write_text(yaml.safe_dump_all(kwok_config.stages(), sort_keys=False))
    # KWOK_WORKDIR: kwok reads <workdir>/kwok.yaml besides --config; ours, so nothing of ~/.kwok comes in
    env = {**os.environ, "KWOK_WORKDIR": str(cp.workdir / "kwok")}
    argv = kwok_config.argv(str(binary), str(cp.kubeconfig), str(config))
    ref, _ = spawn(PROC_NAME, argv, cp.workdir / "logs" / "kwok.log", env, detach)
    cp.register(ref)
    names = []
    with cp.http() as client:
        for index in range(count):
            node = kwok_config.fake_node(index, shape)
            client.post("/api/v1/nodes", json=node).raise_for_status()
            names.append(node["metadata"]["name"])
    log.info("kwok running (pid %d), fake nodes %s", ref.pid, ", ".join(names))
    return ref, names
