"""`helm lint` and golden renders with helm v3 and v4: default values and the non-default value sets."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.chart.chart_helpers import GOLDEN_DIR, UPDATE_ENV, VALUES_DIR, render, run_helm, updating

CASES = {"default": [], **{path.stem: [path] for path in sorted(VALUES_DIR.glob("*.yaml"))}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_is_clean(helm_binaries: dict[str, Path], case: str) -> None:
    for name, helm in helm_binaries.items():
        args = ["lint", "--strict", str(Path(__file__).parents[2] / "charts" / "pd-operator")]
        for values in CASES[case]:
            args += ["--values", str(values)]
        result = run_helm(helm, args)
        assert result.returncode == 0, f"{name} lint {case}:\n{result.stdout}\n{result.stderr}"
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def without_blank_lines(text: str) -> str:
    """helm v4 ends each document with an extra blank line; nothing else differs between versions."""
    return "".join(line for line in text.splitlines(True) if line.strip())


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(helm_binaries: dict[str, Path], case: str) -> None:
    golden = GOLDEN_DIR / f"{case}.yaml"
    renders = {name: without_blank_lines(render(helm, CASES[case])) for name, helm in helm_binaries.items()}
    if updating():
        golden.write_text(next(iter(renders.values())))
    assert golden.exists(), f"missing {golden}; create it with {UPDATE_ENV}=1"
    expected = golden.read_text()
    for name, rendered in renders.items():
        diff = "".join(
            difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True), str(golden), f"{name} template")
        )
        assert not diff, f"{name} render differs from {golden.name} (accept with {UPDATE_ENV}=1):\n{diff}"
