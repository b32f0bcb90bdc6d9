"""One `pdctl plan` run of the seed's workload, shared by the CLI and the browser tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pd_runtime.plan.cli import main


def plan(tmp: Path, rate: float, prompt: int, *extra: str) -> dict[str, Any]:
    argv = [
        "--model", "Qwen/Qwen3-235B-A22B-FP8", "--prompt-tokens", str(prompt), "--output-tokens", "1000",
        "--rate", str(rate), "--slo-ttft-ms", "1000", "--slo-itl-ms", "50", "--rates", "1:9:2", "--seeds", "2",
        "--output", str(tmp / "plan.json"), "--quiet", *extra,
    ]  # fmt: skip
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads((tmp / "plan.json").read_text())
    return doc


@pytest.fixture(scope="session")
def seed_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("seed-plan")
    # vLLM 0.34: write mode between TP sizes (the layouts that change TP are priced from 0.33 on)
    emitted = ("--emit-yaml", str(tmp / "best.yaml"), "--report", str(tmp / "plan.html"))
    return tmp, plan(tmp, 8, 2000, "--vllm-version", "0.34.0", *emitted)
