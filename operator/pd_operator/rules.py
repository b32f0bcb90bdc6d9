"""Validation rules written once, evaluated twice: as CEL by the API server and in Python by pydantic.

Each :class:`Rule` pairs a CEL expression (placed in the CRD's ``x-kubernetes-validations`` of the
model that declares it) with a Python predicate over the same model, and one message (a
:class:`ValueRule` does the same for one item of a list, in its item schema). Keeping both
spellings side by side is what makes ``kubectl apply`` and ``pdctl render`` reject the same specs
with the same words. The helpers below build the CEL text for the GPU-range arithmetic the rules
share, so that every rule parses ranges the same way.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# A GPU range: one index ("5") or an inclusive range ("0-3"); at most two digits per index, so the
# CEL cost estimate of every string operation on it stays tiny.
GPU_RANGE_PATTERN = "^[0-9]{1,2}(-[0-9]{1,2})?$"
GPU_RANGE_MAX_LENGTH = 5
_GPU_RANGE_RE = re.compile(GPU_RANGE_PATTERN)


@dataclass(frozen=True)
class Rule:
    """One validation rule; ``field_path`` (relative, e.g. ``.gpus``) is where errors are reported."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""

    def crd_entry(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


@dataclass(frozen=True)
class Violation:
    """A failed rule, located relative to the object that declares the rule."""

    field_path: str
    message: str


def violations(rules: Iterable[Rule], obj: Any) -> list[Violation]:
    return [Violation(rule.field_path, rule.message) for rule in rules if not rule.check(obj)]


@dataclass(frozen=True)
class ValueRule:
    """A rule on one value, placed in a list's item schema, so the API server and pydantic both name the item
    that breaks it (``spec.prefill.extraArgs[3]``); the message starts with the part of the value the rule
    found (``subject``), e.g. ``--host is managed by the operator``, so both also say which word."""

    cel: str
    check: Callable[[Any], bool]
    subject_cel: str
    subject: Callable[[Any], str]
    message: str  # after the subject
    summary: str  # without a subject: the API server's message should the subject fail to evaluate

    def crd_entry(self) -> dict[str, str]:
        return {
            "rule": self.cel,
            "message": self.summary,
            "messageExpression": f"{self.subject_cel} + {cel_string(' ' + self.message)}",
        }

    def message_for(self, value: Any) -> str:
        return f"{self.subject(value)} {self.message}"


# ---- GPU ranges: Python side ------------------------------------------------------------------


def parse_gpu_range(text: str) -> tuple[int, int] | None:
    """``"0-3"`` -> (0, 3), ``"5"`` -> (5, 5); None when malformed or reversed."""
    if not _GPU_RANGE_RE.match(text):
        return None
    first, _, last = text.partition("-")
    lo, hi = int(first), int(last or first)
    return (lo, hi) if lo <= hi else None


def gpu_indices(text: str) -> list[int]:
    """The GPU indices of a well-formed range, in order (empty if malformed)."""
    bounds = parse_gpu_range(text)
    return list(range(bounds[0], bounds[1] + 1)) if bounds else []


def gpu_count(text: str) -> int:
    return len(gpu_indices(text))


def ranges_disjoint(ranges: Sequence[tuple[int, int]]) -> bool:
    """True when no two inclusive ranges share a value."""
    ordered = sorted(ranges)
    return all(prev[1] < cur[0] for prev, cur in itertools.pairwise(ordered))


# ---- GPU ranges: CEL side -------------------------------------------------------------------------


def cel_range_ok(expr: str) -> str:
    """CEL: the string at ``expr`` is a well-formed, non-reversed range (errors short-circuit to false)."""
    return f"({expr}.matches('{GPU_RANGE_PATTERN}') && {cel_first(expr)} <= {cel_last(expr)})"


def cel_first(expr: str) -> str:
    return f"int({expr}.split('-')[0])"


def cel_last(expr: str) -> str:
    return f"int({expr}.split('-')[{expr}.split('-').size() - 1])"


def cel_count(expr: str) -> str:
    return f"({cel_last(expr)} - {cel_first(expr)} + 1)"


def cel_ranges_disjoint(pairs: str) -> str:
    """CEL: the list-of-[lo, hi] literal ``pairs`` has no two overlapping members.

    Each range may overlap only itself; the list literal is repeated instead of bound with cel.bind
    so the rule works on every API server version that has CEL validation.
    """
    return f"{pairs}.all(r, {pairs}.exists_one(q, q[0] <= r[1] && r[0] <= q[1]))"


def cel_string(text: str) -> str:
    """CEL: a string literal of ``text``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_list(values: Sequence[str]) -> str:
    """CEL: a list literal of the strings ``values``."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"
