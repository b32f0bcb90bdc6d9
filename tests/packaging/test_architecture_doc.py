"""docs/architecture.md's module map names every module of the two packages, and only modules that exist.

A row's first cell names modules in backticks. A name with a folder (`proxy/server.py`) sets the folder for
the bare names after it in the same cell (`cli.py` is then `proxy/cli.py`); a bare name before any folder
is at the package's top. `api/` names a subpackage as a whole; its modules still need rows of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PACKAGES = {"pd_operator": REPO / "operator" / "pd_operator", "pd_runtime": REPO / "runtime" / "pd_runtime"}
PACKAGE_HEADING = re.compile(r"^\*\*`(pd_\w+)`\*\*")
NAME = re.compile(r"`([\w/]+\.py)`")


def modules_in_tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py"}


def modules_in_map(text: str) -> dict[str, set[str]]:
    """Per package: the modules the first cells of its module map's rows name."""
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    named: dict[str, set[str]] = {}
    package = None
    for line in section.splitlines():
        heading = PACKAGE_HEADING.match(line)
        if heading:
            package = heading.group(1)
            named[package] = set()
        elif package is not None and line.startswith("| `"):
            folder = ""
            for name in NAME.findall(line.split("|")[1]):
                if "/" in name:
                    folder = name.rsplit("/", 1)[0] + "/"
                    named[package].add(name)
                else:
                    named[package].add(folder + name)
    return named


def test_the_module_map_names_every_module_and_no_other() -> None:
    named = modules_in_map(DOC.read_text())
    assert set(named) == set(PACKAGES)
    for package, root in PACKAGES.items():
        actual = modules_in_tree(root)
        assert sorted(actual - named[package]) == [], f"{package}: modules without a row in docs/architecture.md"
        assert sorted(named[package] - actual) == [], f"{package}: rows naming modules that do not exist"


def test_a_folder_carries_over_to_the_bare_names_after_it() -> None:
    text = "## Module map\n**`pd_runtime`**\n| `a.py`, `proxy/b.py`, `c.py` | x |\n## Next\n"
    assert modules_in_map(text) == {"pd_runtime": {"a.py", "proxy/b.py", "proxy/c.py"}}
