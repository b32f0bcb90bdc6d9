"""Load tests/operator/invalid_specs.yaml: invalid specs as JSON merge patches over a valid base.

Shared with the e2e suite, which applies the same cases to the API server.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

TABLE = Path(__file__).with_name("invalid_specs.yaml")
VALID_NAME = "invalid"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def load_table() -> dict[str, Any]:
    table: dict[str, Any] = yaml.safe_load(TABLE.read_text())
    return table


def load_cases() -> list[dict[str, Any]]:
    table = load_table()
    return [{**case, "base": table["base"]} for case in table["cases"]]


def name_of(case: dict[str, Any]) -> str:
    """The PDDeployment's metadata.name for a case: its own ``metadataName`` or a valid one."""
    return str(case.get("metadataName", VALID_NAME))


def patched(case: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = merge_patch(case["base"], case["patch"])
    return spec
