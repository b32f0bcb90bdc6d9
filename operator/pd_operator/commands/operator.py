"""`pdctl operator`: run the kopf operator that reconciles PDDeployments.

Watches the given namespaces (or all), serves kopf's liveness endpoint and the operator's Prometheus
metrics, and coordinates replicas through a kopf peering object (or runs standalone).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from pd_operator.commands import policy_file
from pd_operator.settings import Settings

DEFAULT_LIVENESS_PORT = 8080
DEFAULT_METRICS_PORT = 9090
NAMESPACE_ENV = "POD_NAMESPACE"  # the chart sets it from the downward API


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdctl operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", action="append", metavar="NS", help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch the whole cluster")
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=DEFAULT_LIVENESS_PORT,
        help=f"kopf liveness endpoint http://0.0.0.0:PORT/healthz (default {DEFAULT_LIVENESS_PORT})",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"Prometheus metrics on this port, 0 = off (default {DEFAULT_METRICS_PORT})",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME", help="kopf peering object shared by replicas")
    peering.add_argument("--standalone", action="store_true", help="no peering: the only replica")
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority: the highest-priority replica serves, the others stand by "
        "(default: random per process, so replicas never tie; kopf pauses every replica on a tie)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=Settings.resync_seconds,
        help=f"period of the status timer per PDDeployment (default {Settings.resync_seconds:g})",
    )
    parser.add_argument(
        "--drift-repair-seconds",
        type=float,
        default=Settings.drift_repair_seconds,
        help="how often each PDDeployment's Service and NetworkPolicy are re-applied "
        f"(default {Settings.drift_repair_seconds:g}; spec changes apply at once)",
    )
    parser.add_argument(
        "--node-lost-grace-seconds",
        type=float,
        default=Settings.node_lost_grace_seconds,
        help="how long the serving pod's node may be NotReady or unreachable before the pod is force-deleted "
        f"and recreated where GPUs are free (default {Settings.node_lost_grace_seconds:g}, the cluster's "
        "default toleration; a shorter tolerationSeconds of the pod for those taints wins, one that "
        "tolerates them forever keeps the pod)",
    )
    parser.add_argument(
        "--probe-image",
        default=None,
        help="image of the goodput probe Jobs: the operator's own, which has `pdctl bench` (the chart sets it); "
        "default: each PDDeployment's runtime image",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="the tenancy policy (YAML, the chart's ConfigMap; docs/security.md): a PDDeployment outside it is not "
        "reconciled (SpecValid False). Default: the restrictive default policy",
    )
    parser.add_argument(
        "--operator-namespace",
        default=os.environ.get(NAMESPACE_ENV) or Settings.operator_namespace,
        metavar="NS",
        help="the operator's own namespace: the serving pods' NetworkPolicy admits the operator's pods to the admin "
        f"port from it only (default: ${NAMESPACE_ENV}, which the chart sets; else {Settings.operator_namespace})",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger(__name__)
    try:
        tenancy = policy_file.read(args.policy)
    except policy_file.PolicyError as exc:
        log.error("%s", exc)
        return 2
    settings = Settings(
        resync_seconds=args.resync_seconds,
        drift_repair_seconds=args.drift_repair_seconds,
        node_lost_grace_seconds=args.node_lost_grace_seconds,
        probe_image=args.probe_image,
        policy=tenancy,
        operator_namespace=args.operator_namespace,
    )
    import kopf  # imported late: `pdctl crd` and `pdctl render` never pay for it
    from prometheus_client import start_http_server

    from pd_operator import handlers

    if args.metrics_port:
        start_http_server(args.metrics_port)
    log.info(
        "pd-operator starting (%s; handlers from %s; tenancy policy %s; in namespace %s)",
        "all namespaces" if args.all_namespaces else "namespaces " + ", ".join(args.namespace),
        handlers.__name__,
        args.policy or "default",
        args.operator_namespace,
    )
    kopf.run(
        registry=handlers.registry(settings),
        memo=kopf.Memo(operator=handlers.Operator(settings)),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=True if args.standalone else None,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else random.SystemRandom().randint(1, 2**30),
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz",
    )
    return 0
