"""Session fixtures: two clusters, each started on first use and run for the whole session. The agent
cluster (`agent_stack`, `agent_operator`): one control plane, one node agent, the operator as a process.
The real cluster (`real_stack`, `real`, `ns`): a real node (kubelet, containerd), the operator in-cluster
from its image (docs/e2e-real-node.md).

A test module says where it runs: one with ``pytestmark = pytest.mark.real_node`` runs on the real cluster,
the others on the agent one. The fixtures `stack`, `cp`, `operator` (module scope) and `namespace` resolve
to the module's cluster, so a test body is the same on either; the table "Which e2e tests run where" in
docs/e2e-real-node.md lists the modules of each (tests/test_e2e_real_node_table.py keeps it true).

Tests that need more GPU nodes ask `node_pool(name, count)` (node agents) or `real_pool(name, count)`
(real nodes with the fake MI300X device plugins): the pool's nodes start on first use and run until the
session ends, labelled and tainted so that only what `pool_placement(name)` places there lands on them
(the suite's one-node tests never see them).

Set PD_E2E_KEEP=1 to leave the cluster's work directory (logs, pod sandboxes) in place after the run.
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
from e2e.tests.kube import create_namespace

pytestmark = pytest.mark.e2e
REAL_NODE = "real_node"  # the marker of a module that runs on the real cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)


def _require_host_support() -> None:
    """The node agent needs root (network namespaces, mounts) and iproute2/util-linux; say so plainly."""
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"the e2e suite needs root and {missing or 'ip, unshare, nsenter, mount'} (see README)")


def on_real_node(request: pytest.FixtureRequest) -> bool:
    """Whether the requesting test's module carries the `real_node` marker."""
    return request.node.get_closest_marker(REAL_NODE) is not None


@pytest.fixture(scope="session")
def agent_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The node-agent cluster: control plane and one node agent."""
    yield from _session_stack(request, Stack(ControlPlane(workdir=new_workdir(), bin_dir=binaries_dir())))


@pytest.fixture(scope="session")
def real_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A cluster of its own on a real node (kubelet, containerd, kube-proxy, CoreDNS; docs/e2e-real-node.md),
    the chart installed with the operator running in-cluster from its image; started on first use."""
    cp = ControlPlane(workdir=new_workdir("pd-e2e-real-"), bin_dir=binaries_dir("--node"))
    yield from _session_stack(request, Stack(cp), real=True)


def _session_stack(request: pytest.FixtureRequest, st: Stack, real: bool = False) -> Iterator[Stack]:
    """`st` up (a real node and the operator in-cluster, or one node agent) for the session, then down;
    the logs of a failed session on stderr."""
    _require_host_support()
    cp = st.cp
    try:
        if real:
            st.up(real=True)
        else:
            cp.start()
            st.start_agent()
        yield st
    finally:
        if request.session.testsfailed:
            for logs in [cp.workdir / "logs", *cp.workdir.glob("nodes/*/logs")]:
                _dump_logs(logs)
            if real:
                _dump_operator_pod_log(st)
        keep = os.environ.get("PD_E2E_KEEP") == "1"
        st.down(remove=not keep)
        if keep:
            sys.stderr.write(f"\ne2e work directory kept: {cp.workdir}\n")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Stack:
    """The module's cluster: `real_stack` for a module marked `real_node`, else `agent_stack`."""
    found: Stack = request.getfixturevalue("real_stack" if on_real_node(request) else "agent_stack")
    return found


@pytest.fixture(scope="module")
def cp(stack: Stack) -> ControlPlane:
    return stack.cp


@pytest.fixture(scope="session")
def agent_operator(agent_stack: Stack) -> Stack:
    """The chart installed (helm v3) and the operator running as a process with the chart's ServiceAccount."""
    agent_stack.install_operator()
    agent_stack.start_operator()
    return agent_stack


@pytest.fixture(scope="module")
def operator(request: pytest.FixtureRequest, stack: Stack) -> Stack:
    """The module's cluster with the operator running: in-cluster from its image on the real cluster (the
    chart's Deployment, installed when the cluster came up), as a process on the agent one."""
    if on_real_node(request):
        return stack
    found: Stack = request.getfixturevalue("agent_operator")
    return found


@pytest.fixture(scope="session")
def node_pool(agent_stack: Stack) -> Callable[[str, int], list[str]]:
    """Start a pool of `count` more 8-GPU node agents once per name (agent cluster); returns their node names."""
    pools: dict[str, list[str]] = {}

    def start(name: str, count: int) -> list[str]:
        if name not in pools:
            pools[name] = agent_stack.start_pool(name, count)
        assert len(pools[name]) == count, f"pool {name} already runs {len(pools[name])} nodes"
        return pools[name]

    return start


@pytest.fixture(scope="session")
def real(real_stack: Stack) -> ControlPlane:
    return real_stack.cp


@pytest.fixture
def ns(real: ControlPlane) -> Iterator[str]:
    """A fresh namespace of the real cluster (Pod Security baseline), deleted afterwards."""
    name = create_namespace(real, f"r-{secrets.token_hex(3)}")
    yield name
    real.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def real_pool(real_stack: Stack) -> Callable[[str, int], list[str]]:
    """`count` real 8-GPU nodes `<name>-<i>` (the fake MI300X device plugins); a node a test tore down
    (a lost node) is started again when a test asks for the pool next. Returns their node names."""
    plugins = {"devices": device_plugins.real_node_plugin()}
    return lambda name, count: real_stack.start_real_pool(name, count, plugins)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pod_security(level): the Pod Security level the test's namespace enforces (default baseline)"
    )
    config.addinivalue_line(
        "markers",
        f"{REAL_NODE}: the module runs on the real cluster (real nodes, the operator in-cluster): `stack`, `cp`, "
        "`operator` and `namespace` resolve there (module-level pytestmark; docs/e2e-real-node.md)",
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
