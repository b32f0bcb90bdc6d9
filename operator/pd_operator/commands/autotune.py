"""`pdctl autotune accept NAME`: pin the tuned layout of a PDDeployment into its spec.

Reads ``status.autotune.tuned``, writes the layout fields of the spec (mode, prefill, decode, colocated,
kvTransfer) as that layout and sets ``autotune.enabled: false``, in one JSON merge patch. ``--print``
prints the patch instead, for review or for ``kubectl patch pdd NAME --type merge -p "$(...)"``.
Exit codes: 0 done; 1 the API server refused or the deployment has no tuned layout; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from pd_operator import api, autotune
from pd_operator.kube import Kube, KubeError
from pd_operator.observe import parse
from pd_operator.validation import SpecError

EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdctl autotune", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    accept = verbs.add_parser("accept", help="write the tuned layout into the spec and turn autotuning off")
    accept.add_argument("name", help="the PDDeployment")
    accept.add_argument("-n", "--namespace", default="default")
    accept.add_argument("--print", action="store_true", help="print the merge patch of .spec, change nothing")
    return parser


def _path(namespace: str, name: str) -> str:
    return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}"


async def _accept(kube: Kube, namespace: str, name: str, print_only: bool) -> str:
    obj = await kube.call("GET", _path(namespace, name))
    patch = autotune.accept_patch(obj.get("spec") or {}, parse(obj.get("status") or {}).autotune)
    if print_only:
        return json.dumps(patch)
    await kube.call("PATCH", _path(namespace, name), {"spec": patch}, content_type="application/merge-patch+json")
    return f"pddeployment {namespace}/{name}: spec pinned to {obj['status']['autotune']['tuned']}, autotune off"


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        line = asyncio.run(_accept(Kube.from_environment(), args.namespace, args.name, args.print))
    except (KubeError, SpecError, ValueError) as exc:
        sys.stderr.write(f"pdctl autotune accept: {exc}\n")
        return EXIT_FAILED
    sys.stdout.write(line + "\n")
    return 0
