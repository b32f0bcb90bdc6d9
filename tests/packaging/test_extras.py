"""pyproject.toml's extras against the imports of the code: each `pdctl` subcommand gets what it imports
from its own extra, and nothing is declared that no shipped code imports."""

from __future__ import annotations

import pytest

from pd_runtime.cli import OPTIONAL_MODULES, SUBCOMMANDS
from tests.packaging.declared import (
    NOT_YET_IMPORTED,
    TOOL_EXTRAS,
    declared_in,
    distribution_of,
    extras,
    installed_by,
    third_party_modules,
)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_gets_its_imports_from_its_extra(name: str) -> None:
    sub = SUBCOMMANDS[name]
    needed = {distribution_of(m) for m in third_party_modules(sub.module) - set(OPTIONAL_MODULES)}
    missing = needed - installed_by([sub.extra])
    assert not missing, f"pdctl {name} imports {sorted(missing)}, which the {sub.extra or 'base'} install lacks"


@pytest.mark.parametrize("module", sorted(OPTIONAL_MODULES))
def test_each_optional_module_comes_with_the_extra_pdctl_names(module: str) -> None:
    extra = OPTIONAL_MODULES[module]
    assert declared_in(extra) == {distribution_of(module)}
    assert distribution_of(module) not in installed_by([None])


@pytest.mark.parametrize("extra", [None, *sorted(set(extras()) - TOOL_EXTRAS)])
def test_every_declared_dependency_is_imported_by_the_code_that_needs_it(extra: str | None) -> None:
    users = [sub.module for sub in SUBCOMMANDS.values() if sub.extra == extra]
    modules = {m for user in users for m in third_party_modules(user)}
    modules |= {m for m, e in OPTIONAL_MODULES.items() if e == extra}
    imported = {distribution_of(m) for m in modules}
    unused = declared_in(extra) - imported - set(NOT_YET_IMPORTED)
    assert not unused, f"{extra or 'base'} declares {sorted(unused)}, which none of {users} imports"


def test_the_tool_extras_hold_no_runtime_dependency() -> None:
    """`make venv` installs `dev`; what the code needs at run time is declared where the code is."""
    runtime_extras = sorted(set(extras()) - TOOL_EXTRAS)
    assert declared_in("test").isdisjoint(installed_by(runtime_extras))
    assert installed_by(["dev"]) == installed_by([*runtime_extras, "test"])
