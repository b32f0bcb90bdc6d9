"""The table "Which e2e tests run where" of docs/e2e-real-node.md says what the e2e modules do: a module
whose row says it runs on real nodes carries the `real_node` marker (e2e/tests/conftest.py then runs it
on the real cluster), every other one does not, and every e2e test module has exactly one row.

Read from the files' text (the table's markdown, each module's syntax tree), so no cluster is needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "e2e-real-node.md"
E2E_TESTS = REPO / "e2e" / "tests"
HEADING = "## Which e2e tests run where"


def documented() -> dict[str, str]:
    """test file -> the first word of its row's "runs on" cell (real, agent, none)."""
    section = DOC.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or not cells[0].startswith("`"):
            continue
        where = re.match(r"\w+", cells[1])
        assert where, line
        for name in re.findall(r"`(test_\w+\.py)`", cells[0]):
            assert name not in rows, f"{name} has two rows in {DOC.name}"
            rows[name] = where.group(0)
    return rows


def marked_real_node(path: Path) -> bool:
    """Whether the module's own `pytestmark` names the real_node marker (pytest.mark.real_node, alone or
    in a list)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == "real_node" for n in ast.walk(node.value))
    return False


def modules() -> list[Path]:
    return sorted(E2E_TESTS.glob("test_*.py"))


def test_every_e2e_module_has_one_row() -> None:
    rows = documented()
    names = {path.name for path in modules()}
    assert sorted(names - rows.keys()) == [], "e2e test modules missing from the table"
    assert sorted(rows.keys() - names) == [], "rows naming no e2e test module"
    assert set(rows.values()) <= {"real", "agent", "none"}, rows


def test_the_rows_that_say_real_are_the_modules_marked_real_node() -> None:
    rows = documented()
    marked = {path.name for path in modules() if marked_real_node(path)}
    said = {name for name, where in rows.items() if where == "real"}
    assert sorted(marked - said) == [], "marked real_node, but the table says they run elsewhere"
    assert sorted(said - marked) == [], "the table says real, but the module lacks the real_node marker"


def test_the_marker_is_seen_as_pytest_would_see_it(tmp_path: Path) -> None:
    """The parser finds the marker alone and in a list, and nothing in a module without one."""
    cases = {
        "pytestmark = pytest.mark.real_node\n": True,
        "pytestmark = [pytest.mark.slow, pytest.mark.real_node]\n": True,
        "pytestmark = pytest.mark.slow\n": False,
        "def test_x():\n    pytestmark = pytest.mark.real_node\n": False,
    }
    for text, expected in cases.items():
        path = tmp_path / "test_case.py"
        path.write_text(f"import pytest\n{text}")
        assert marked_real_node(path) is expected, text
