"""`pdctl bench --report`: a sweep against the calibration server, its page opened in headless Chromium."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from pd_runtime.bench.calibration_server import Behaviour
from tests.bench.conftest import ServerThread
from tests.bench.test_bench_cli import FAST, bench
from tests.browser.cdp import open_page

SHOWN = """JSON.stringify({
  rows: [...document.querySelectorAll('#ranked tr.layout-row')]
    .map(r => r.dataset.layout + '@' + r.children[1].textContent),
  charts: ['curves', 'ttft', 'itl'].map(id => document.querySelectorAll('#' + id + ' svg polyline.series').length),
  verdict: document.querySelector('#verdict strong').textContent,
})"""


def test_bench_report_loads_and_shows_every_stage(
    calibration_server: Callable[[Behaviour], ServerThread], tmp_path: Path
) -> None:
    server = calibration_server(FAST)
    report = tmp_path / "bench.html"
    code, result = bench(server.url, tmp_path, "--sweep", "50:100:50", "--label", "A", "--report", str(report),
                         requests=5)  # fmt: skip
    assert code == 0
    page = asyncio.run(open_page(report, SHOWN))
    assert page.errors == []
    shown = json.loads(page.value)
    assert shown["rows"] == ["A@50.0", "A@100.0"]
    assert shown["charts"] == [1, 1, 1]
    assert f"{100 * result['attainment']:.0f} %" in shown["verdict"]
