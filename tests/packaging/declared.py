"""What pyproject.toml declares and what the shipped code imports, both as distribution names.

The imports come from grimp's graph of pd_operator and pd_runtime (the graph import-linter checks),
so an import inside a function counts as much as one at the top of a module; imports under
``TYPE_CHECKING`` do not, since nothing needs them at run time.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
PROJECT = "pd-operator"
SHIPPED = ("pd_operator", "pd_runtime")
EXTRA_REFERENCE = re.compile(r"^pd-operator\[([^\]]+)\]$")

NOT_YET_IMPORTED: dict[str, str] = {}
TOOL_EXTRAS = {"test", "dev"}
"""Extras of tools for developing the project, not of anything that runs."""

PROVIDED_BY = {"pydantic-core": "pydantic"}
"""Distributions imported directly that come with a declared one (pydantic pins its own core)."""


def canonical(name: str) -> str:
    """PEP 503 normalisation: PyYAML, pyyaml and py_yaml are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _project_table() -> dict[str, object]:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    return project


def extras() -> dict[str, list[str]]:
    table = _project_table()["optional-dependencies"]
    assert isinstance(table, dict)
    return table


def _names(requirements: Iterable[str]) -> set[str]:
    return {canonical(re.split(r"[\s<>=!~;\[,]", requirement, maxsplit=1)[0]) for requirement in requirements}


def declared_in(extra: str | None) -> set[str]:
    """The distributions an extra (None: the base install) lists itself, without the extras it includes."""
    listed = _project_table()["dependencies"] if extra is None else extras()[extra]
    assert isinstance(listed, list)
    return _names(r for r in listed if not EXTRA_REFERENCE.match(r))


def installed_by(wanted: Iterable[str | None]) -> set[str]:
    """Every distribution `pip install 'pd-operator[...]'` with these extras installs directly:
    the base install plus each extra and the extras it includes."""
    names = declared_in(None)
    pending, seen = [e for e in wanted if e is not None], set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        names |= declared_in(extra)
        for requirement in extras()[extra]:
            if match := EXTRA_REFERENCE.match(requirement):
                pending += [e.strip() for e in match.group(1).split(",")]
    return names


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*SHIPPED, include_external_packages=True, exclude_type_checking_imports=True)


def third_party_modules(module: str) -> set[str]:
    """Top-level third-party modules that ``module`` imports, directly or through other shipped modules."""
    graph = _graph()
    reached = graph.find_upstream_modules(module)
    return {m for m in reached if m.split(".")[0] not in (*SHIPPED, *sys.stdlib_module_names)}


def distribution_of(module: str) -> str:
    """The declared distribution that provides a top-level module (as installed in this venv); of a
    namespace package that several distributions fill (``opentelemetry``), the one pyproject declares."""
    names = {canonical(d) for d in packages_distributions()[module]}
    if len(names) > 1:
        names &= installed_by([None, *extras()])
    (name,) = names
    return PROVIDED_BY.get(name, name)
