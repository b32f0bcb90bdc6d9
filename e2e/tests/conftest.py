"""Session fixtures: one cluster of real nodes (kubelet, containerd, kube-proxy, CoreDNS), started on first
use and run for the whole session, the operator in-cluster from its image, installed by the chart
(docs/e2e-real-node.md): the fixtures `stack`, `cp` and `operator` are that cluster, `namespace` a fresh
namespace of it per test. The table "Which e2e tests run where" in docs/e2e-real-node.md lists every module
(tests/test_e2e_real_node_table.py keeps it true).

Tests that need more GPU nodes ask `real_pool(name, count)` (real nodes with the fake MI300X device
plugins): the pool's nodes start on first use and run until the session ends (a node a test removed is
started again), labelled and tainted so that only what `pool_placement(name)` places there lands on them
(the suite's one-node tests never see them).

Set PD_E2E_KEEP=1 to leave the cluster's work directory (logs, node roots) in place after the run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e import device_plugins
from e2e.cluster import ControlPlane, binaries_dir, new_workdir
from e2e.stack import OPERATOR_NAMESPACE, Stack
from e2e.tests.kube import ContainerRuntimes, create_namespace

pytestmark = pytest.mark.e2e


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)


def _require_host_support() -> None:
    """Real nodes need root (network namespaces, mounts, cgroups) and iproute2/util-linux; say so plainly."""
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"the e2e suite needs root and {missing or 'ip, unshare, nsenter, mount'} (see README)")


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The cluster (docs/e2e-real-node.md): a real node, the chart installed with the operator running
    in-cluster from its image; up for the session, then down; the logs of a failed session on stderr. A
    watch of all pods checks at the end that every container of the session was containerd's."""
    _require_host_support()
    st = Stack(ControlPlane(workdir=new_workdir("pd-e2e-real-"), bin_dir=binaries_dir("--node")))
    cp = st.cp
    try:
        st.up()
        with ContainerRuntimes(cp, "") as runtimes:
            yield st
        others = runtimes.others("containerd")
        assert not others, f"containers of the suite not run by a real node's containerd: {others}"
        assert runtimes.containers.get("containerd"), "the pod watch saw no container at all"
    finally:
        if request.session.testsfailed:
            for logs in [cp.workdir / "logs", *cp.workdir.glob("nodes/*/logs")]:
                _dump_logs(logs)
            _dump_operator_pod_log(st)
        keep = os.environ.get("PD_E2E_KEEP") == "1"
        st.down(remove=not keep)
        if keep:
            sys.stderr.write(f"\ne2e work directory kept: {cp.workdir}\n")


@pytest.fixture(scope="session")
def cp(stack: Stack) -> ControlPlane:
    return stack.cp


@pytest.fixture(scope="session")
def operator(stack: Stack) -> Stack:
    """The cluster with the operator running in-cluster (the chart's Deployment, installed at its start)."""
    return stack


@pytest.fixture(scope="session")
def real_pool(stack: Stack) -> Callable[[str, int], list[str]]:
    """`count` real 8-GPU nodes `<name>-<i>` (the fake MI300X device plugins); a node a test tore down
    (a lost node) is started again when a test asks for the pool next. Returns their node names."""
    plugins = {"devices": device_plugins.real_node_plugin()}
    return lambda name, count: stack.start_real_pool(name, count, plugins)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pod_security(level): the Pod Security level the test's namespace enforces (default baseline)"
    )


@pytest.fixture
def namespace(cp: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, enforcing Pod Security baseline unless the test's pod_security marker says
    otherwise (a test that runs privileged or host-network pods asks for privileged, as a user would have to);
    deleted afterwards (namespace controller and GC clean up)."""
    marker = request.node.get_closest_marker("pod_security")
    name = create_namespace(cp, f"t-{secrets.token_hex(3)}", marker.args[0] if marker else "baseline")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _dump_operator_pod_log(st: Stack, lines: int = 80) -> None:
    """The in-cluster operator's log, read through its pod (it is no process of ours)."""
    try:
        name = st.operator_deployment()["metadata"]["name"]
    except RuntimeError as err:
        sys.stderr.write(f"\nno operator pod's log: {err}\n")
        return
    argv = ("logs", "-n", OPERATOR_NAMESPACE, f"deployment/{name}", f"--tail={lines}", "--all-containers")
    out = st.cp.kubectl(*argv, check=False)
    sys.stderr.write(f"\n===== last {lines} lines of the operator pod's log =====\n{out}\n")


def _dump_logs(logs: Path, lines: int = 80) -> None:
    if not logs.exists():
        return
    for path in sorted(logs.glob("*.log")):
        if path.name.startswith(("kube-", "etcd")):
            lines = 15
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        sys.stderr.write(f"\n===== last {lines} lines of {path.name} =====\n" + "\n".join(tail) + "\n")
