"""The plan report in real headless Chromium (Debian's package; `make unit` installs it): it loads without
errors and shows every priced layout in the table and in each chart. A missing browser fails the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.cdp import open_page

SHOWN = """JSON.stringify({
  rows: [...document.querySelectorAll('#ranked tr.layout-row')].map(r => r.dataset.layout),
  charts: Object.fromEntries(['curves', 'ttft', 'itl'].map(id =>
    [id, [...document.querySelectorAll('#' + id + ' svg polyline.series')].map(p => p.dataset.label)])),
  verdict: document.querySelector('#verdict strong').textContent,
  inputs: document.querySelector('#inputs').textContent,
  external: [...document.querySelectorAll('[src], link[href]')].length,
})"""


@pytest.fixture(scope="module")
def shown(seed_plan: tuple[Path, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    import asyncio

    tmp, _ = seed_plan
    report = asyncio.run(open_page(tmp / "plan.html", SHOWN))
    return json.loads(report.value), report.errors


def test_report_loads_without_errors_and_shows_every_layout(
    seed_plan: tuple[Path, dict[str, Any]], shown: tuple[dict[str, Any], list[str]]
) -> None:
    _, doc = seed_plan
    page, errors = shown
    assert errors == []
    layouts = [row["layout"] for row in doc["layouts"]]
    assert page["rows"] == layouts
    for chart in ("curves", "ttft", "itl"):
        assert page["charts"][chart] == layouts, chart
    assert page["verdict"] == doc["verdict"]["text"]
    assert "Qwen/Qwen3-235B-A22B-FP8" in page["inputs"]
    assert page["external"] == 0  # self-contained: nothing to fetch
