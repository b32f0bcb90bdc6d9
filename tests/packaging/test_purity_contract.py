"""Every module whose docstring says it is pure is one import-linter checks (pyproject.toml's purity
contract), so the claim cannot outlive an I/O import."""

from __future__ import annotations

import ast

from tests.packaging.declared import REPO, pyproject


def _checked_modules() -> list[str]:
    tool = pyproject()["tool"]
    assert isinstance(tool, dict)
    (contract,) = [c for c in tool["importlinter"]["contracts"] if c["name"].startswith("Pure modules")]
    return list(contract["source_modules"])


def _modules_calling_themselves_pure() -> list[str]:
    found = []
    for root in ("operator", "runtime"):
        for path in sorted((REPO / root).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            if docstring.startswith("Pure"):
                found.append(".".join(path.relative_to(REPO / root).with_suffix("").parts))
    return found


def test_every_module_that_says_pure_is_checked() -> None:
    checked = _checked_modules()
    unchecked = [
        module
        for module in _modules_calling_themselves_pure()
        if not any(module == c or module.startswith(c + ".") for c in checked)
    ]
    assert unchecked == []
