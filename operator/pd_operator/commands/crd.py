"""`pdctl crd`: print the PDDeployment CustomResourceDefinition (the same text as crds/pddeployment.yaml)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pd_operator import crd


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pdctl crd", description=__doc__)
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    args = parser.parse_args(list(argv))
    if args.output == "json":
        sys.stdout.write(json.dumps(crd.crd(), indent=2) + "\n")
    else:
        sys.stdout.write(crd.crd_yaml())
    return 0
