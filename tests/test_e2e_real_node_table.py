"""The table "Which e2e tests run where" of docs/e2e-real-node.md says what the e2e modules do: every e2e
test module has exactly one row, a row says `real` (the module runs on the suite's cluster of real nodes)
or `none` (no cluster), and a module's row says `real` exactly when one of its functions asks for a
cluster fixture of e2e/tests/conftest.py.

Read from the files' text (the table's markdown, each module's syntax tree), so no cluster is needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "e2e-real-node.md"
E2E_TESTS = REPO / "e2e" / "tests"
HEADING = "## Which e2e tests run where"
CLUSTER_FIXTURES = frozenset({"stack", "cp", "operator", "namespace", "real_pool"})


def documented() -> dict[str, str]:
    """test file -> the first word of its row's "runs on" cell (real, none)."""
    section = DOC.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or not cells[0].startswith("`test_"):
            continue
        where = re.match(r"\w+", cells[1])
        assert where, line
        for name in re.findall(r"`(test_\w+\.py)`", cells[0]):
            assert name not in rows, f"{name} has two rows in {DOC.name}"
            rows[name] = where.group(0)
    return rows


def uses_cluster(path: Path) -> bool:
    """Whether a function of the module (a test or a fixture) takes one of the cluster fixtures."""
    return any(
        arg.arg in CLUSTER_FIXTURES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for arg in node.args.args
    )


def modules() -> list[Path]:
    return sorted(E2E_TESTS.glob("test_*.py"))


def test_every_e2e_module_has_one_row() -> None:
    rows = documented()
    names = {path.name for path in modules()}
    assert sorted(names - rows.keys()) == [], "e2e test modules missing from the table"
    assert sorted(rows.keys() - names) == [], "rows naming no e2e test module"
    assert set(rows.values()) <= {"real", "none"}, rows


def test_the_rows_that_say_real_are_the_modules_that_use_the_cluster() -> None:
    rows = documented()
    using = {path.name for path in modules() if uses_cluster(path)}
    said = {name for name, where in rows.items() if where == "real"}
    assert sorted(using - said) == [], "they use the cluster, but the table says none"
    assert sorted(said - using) == [], "the table says real, but they use no cluster fixture"


def test_a_cluster_fixture_is_seen_in_tests_and_fixtures_alone(tmp_path: Path) -> None:
    cases = {
        "def test_x(cp): pass\n": True,
        "@pytest.fixture\ndef made(stack):\n    return stack\n": True,
        "async def test_y(namespace): pass\n": True,
        "def test_z(tmp_path): pass\n": False,
        "cp = 1\n": False,
    }
    for text, expected in cases.items():
        path = tmp_path / "test_case.py"
        path.write_text(f"import pytest\n{text}")
        assert uses_cluster(path) is expected, text
