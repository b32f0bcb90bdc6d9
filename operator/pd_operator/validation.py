"""Turn pydantic's validation errors into the API server's wording, one line per problem.

``pdctl render`` and the operator's SpecValid condition show these lines. Paths are written from the
object root (``spec.prefill.gpus``) and the messages of schema checks are phrased as kube-apiserver
phrases them (``Required value``, ``Unsupported value: ...``), so a user sees the same words offline
as from ``kubectl apply``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from pd_operator.api import PDDeploymentSpec
from pd_operator.conditions import INVALID_SPEC
from pd_operator.rules import Violation


class SpecError(ValueError):
    """An invalid PDDeployment spec; ``problems`` are ``"<path>: <message>"`` lines; ``reason`` is SpecValid's
    reason: InvalidSpec for the API's rules, the rule's name for the tenancy policy's (policy.py)."""

    def __init__(self, problems: list[str], reason: str = INVALID_SPEC) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.reason = reason


def _path(root: str, loc: tuple[int | str, ...], suffix: str = "") -> str:
    parts = [root]
    for item in loc:
        parts.append(f"[{item}]" if isinstance(item, int) else f".{item}")
    return "".join(parts) + suffix


def _expected_values(ctx: Mapping[str, Any]) -> str:
    values = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
    return ", ".join(json.dumps(v) for v in values)


def _lines(error: ErrorDetails, root: str) -> list[str]:
    loc = tuple(error["loc"])
    kind = error["type"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if kind == "spec_rule":
        found: list[Violation] = ctx["violations"]
        return [f"{_path(root, loc, v.field_path)}: {v.message}" for v in found]
    if kind == "missing":
        return [f"{_path(root, loc)}: Required value"]
    if kind == "literal_error":
        shown = json.dumps(error["input"]) if isinstance(error["input"], str | int | float) else "value"
        return [f"{_path(root, loc)}: Unsupported value: {shown}: supported values: {_expected_values(ctx)}"]
    if kind == "extra_forbidden":
        return [f"{_path(root, loc)}: field not declared in schema"]
    return [f"{_path(root, loc)}: {error['msg']}"]


def problems_of(exc: ValidationError, root: str = "spec") -> list[str]:
    return [line for error in exc.errors() for line in _lines(error, root)]


def validate_spec(spec: Any) -> PDDeploymentSpec:
    """Validate a spec mapping (from YAML or the API server); raises :class:`SpecError`."""
    if not isinstance(spec, Mapping):
        raise SpecError(["spec: Required value"])
    try:
        return PDDeploymentSpec.model_validate(dict(spec))
    except ValidationError as exc:
        raise SpecError(problems_of(exc)) from exc
