"""`pdctl render FILE`: print every object the operator would create for the PDDeployments in FILE.

Validation runs offline with the same rules and messages as the API server, then the tenancy policy
(the default one, or ``--policy FILE``: the chart's ``policy:`` values, docs/security.md) as the chart's
ValidatingAdmissionPolicy and the operator apply it; an invalid or refused spec prints one line per
problem on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pd_operator import api, goodput, layout, naming, policy, render
from pd_operator.commands import policy_file
from pd_operator.validation import SpecError, validate_spec

EXIT_INVALID = 2


def objects_for(
    doc: Any,
    namespace: str | None,
    tenancy: policy.TenancyPolicy = policy.DEFAULT_POLICY,
    operator_namespace: str = render.OPERATOR_NAMESPACE,
) -> list[dict[str, Any]]:
    """The children (and the probe Job, when probes are enabled) of one PDDeployment document."""
    if not isinstance(doc, dict) or doc.get("apiVersion") != api.API_VERSION or doc.get("kind") != api.KIND:
        raise SpecError([f"apiVersion/kind: expected {api.API_VERSION} {api.KIND}"])
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(["metadata.name: Required value"])
    problems = naming.name_problems(name)
    try:
        spec = validate_spec(doc.get("spec"))
    except SpecError as exc:
        raise SpecError([*problems, *exc.problems]) from exc
    if problems:
        raise SpecError(problems)
    owner = layout.Owner(name=name, namespace=namespace or meta.get("namespace") or "default")
    policy.enforce(spec, tenancy, namespace=owner.namespace)
    lay = layout.build(owner, spec)
    children = render.children(lay, operator_namespace)
    # The operator would draw the keys once; applying this output again draws new ones (docs/security.md).
    keys = {key: secrets.token_urlsafe(render.KEY_BYTES) for key in render.CREDENTIAL_KEYS}
    objs = [{**children.credentials, "stringData": keys}, *children.applied, *children.pods]
    if spec.goodput_probe.enabled:
        objs.append(render.probe_job(lay, f"{name[: goodput.JOB_PREFIX_LENGTH]}-goodput-probe"))
    return objs


def _load(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pdctl render", description=__doc__)
    parser.add_argument("file", help="PDDeployment YAML file ('-' = stdin)")
    parser.add_argument("-n", "--namespace", help="namespace of the objects (default: the file's, or default)")
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    parser.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="tenancy policy YAML (the chart's policy: values; default: the chart's defaults)",
    )
    parser.add_argument(
        "--operator-namespace",
        default=render.OPERATOR_NAMESPACE,
        metavar="NS",
        help="the operator's namespace, from which the NetworkPolicy admits it to the admin port "
        f"(default {render.OPERATOR_NAMESPACE})",
    )
    args = parser.parse_args(list(argv))
    try:
        docs = _load(args.file)
        tenancy = policy_file.read(args.policy)
    except (OSError, yaml.YAMLError) as exc:
        sys.stderr.write(f"pdctl render: cannot read {args.file}: {exc}\n")
        return EXIT_INVALID
    except policy_file.PolicyError as exc:
        sys.stderr.write(f"pdctl render: {exc}\n")
        return EXIT_INVALID
    objs: list[dict[str, Any]] = []
    for doc in docs:
        try:
            objs += objects_for(doc, args.namespace, tenancy, args.operator_namespace)
        except SpecError as exc:
            name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc, dict) else "?"
            lines = "".join(f"  {p}\n" for p in exc.problems)
            sys.stderr.write(f"pdctl render: {args.file}: invalid PDDeployment {name!r}:\n{lines}")
            return EXIT_INVALID
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False, width=1000))
    return 0
