"""`make cluster-up` / `make cluster-down` for people (`python -m e2e.cluster_cli up|down|status`): the
stack of `make demo` (control plane, a real node, the chart and the operator from its image) started and
left running, its state in a directory, so that `down` stops exactly what `up` started and removes what it
made (processes, mounts, network namespaces, cgroups, the bridge and files)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from e2e.cluster import DEFAULT_STATE_DIR, ControlPlane, binaries_dir
from e2e.procs import is_running
from e2e.stack import Stack


def _cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if (state_dir / "state.json").exists():
        sys.stderr.write(f"a cluster is already up (state in {state_dir}); run `make cluster-down` first\n")
        return 1
    stack = Stack(ControlPlane(workdir=state_dir, bin_dir=binaries_dir("--node")), detach=True)
    try:
        stack.up(operator=not args.no_operator, node=not args.no_node)
        for name, count in args.pool:
            stack.start_real_pool(name, count)
    except BaseException:
        stack.down()
        raise
    cp = stack.cp
    sys.stdout.write(
        f"control plane up at {cp.server}\n"
        f"  export KUBECONFIG={cp.kubeconfig}\n"
        f"  export PATH={cp.bin_dir}:$PATH   # kubectl and helm of the matching version\n"
        f"  control-plane logs: {cp.workdir / 'logs'}, each node's: {cp.workdir / 'nodes' / 'NODE' / 'logs'}\n"
        "  nodes: kubectl get nodes -o wide; operator: kubectl -n pd-system logs deploy/pd-operator\n"
        "  stop: make cluster-down\n"
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if not (state_dir / "state.json").exists():
        sys.stdout.write(f"no cluster state in {state_dir}; nothing to stop\n")
        return 0
    Stack(ControlPlane.load(state_dir), detach=True).down()
    sys.stdout.write("cluster stopped and its files removed\n")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if not (state_dir / "state.json").exists():
        sys.stdout.write("down\n")
        return 1
    cp = ControlPlane.load(state_dir)
    for ref in cp.procs:
        sys.stdout.write(f"{ref.name:28} pid {ref.pid:7} {'running' if is_running(ref) else 'STOPPED'}\n")
    sys.stdout.write(f"KUBECONFIG={cp.kubeconfig}\n")
    return 0


def _pool(text: str) -> tuple[str, int]:
    name, _, count = text.partition("=")
    if not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"bad pool {text!r}: expected NAME=COUNT")
    return name, int(count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster_cli", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start control plane, a node and the operator; leave them running")
    up.add_argument("--no-operator", action="store_true", help="do not install the chart or run the operator")
    up.add_argument("--no-node", action="store_true", help="start no node")
    up.add_argument(
        "--pool",
        action="append",
        default=[],
        type=_pool,
        metavar="NAME=COUNT",
        help="also start COUNT nodes NAME-0.. labelled and tainted pd.serving.dev/e2e-pool=NAME (repeatable)",
    )
    sub.add_parser("down", help="stop everything `up` started and remove its files")
    sub.add_parser("status", help="show the recorded processes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    handlers = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
