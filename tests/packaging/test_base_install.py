"""`pip install .` without extras, in a fresh virtual environment: `pdctl bench` works, and every
subcommand that needs an extra says which one in a line instead of a traceback. The machine stands for one
without a C compiler: the install takes the proxy's modules as Python (docs/proxy.md, "Compiled request
path")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pd_runtime.cli import SUBCOMMANDS
from tests.packaging.declared import installed_by
from tests.packaging.venvs import NO_COMPILER, copy_source, present_modules, run_install

RUN_ARGS = {"operator": ["--all-namespaces", "--standalone"]}  # its --help needs no kopf; a start does
ABSENT = ("matplotlib", "uvloop", "kopf", "kubernetes", "pydantic", "yaml", "zmq", "msgpack", "prometheus_client")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_base_install_runs_the_bench_and_names_the_extra_of_everything_else(tmp_path: Path) -> None:
    assert "matplotlib" not in installed_by([None])
    source = copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    run_install(f'python3 -m venv "{venv}" && "{venv}/bin/pip" install -q "{source}"', NO_COMPILER, source, [])
    assert list(venv.glob("lib/python*/site-packages/pd_runtime/**/*.so")) == []  # no compiler: Python
    assert present_modules(venv / "bin" / "python", ABSENT) == set()
    pdctl = str(venv / "bin" / "pdctl")

    bench_help = subprocess.run([pdctl, "bench", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert bench_help.returncode == 0, bench_help.stderr
    assert "--slo-ttft-ms" in bench_help.stdout

    result = tmp_path / "result.json"
    result.write_text(json.dumps({"rate": 1.0, "attainment": 1.0, "attainment_ci": [0.9, 1.0]}))
    plot = subprocess.run(
        [pdctl, "bench", "--plot", str(tmp_path / "out.png"), str(result)], capture_output=True, text=True, check=False
    )
    assert (plot.returncode, plot.stderr.splitlines()) == (
        1,
        ["pdctl bench: needs the 'plot' extra (matplotlib is not installed): pip install 'pd-operator[plot]'"],
    )

    for name, sub in SUBCOMMANDS.items():
        if sub.extra is None:
            continue
        args = RUN_ARGS.get(name, ["--help"])
        ran = subprocess.run([pdctl, name, *args], capture_output=True, text=True, timeout=60, check=False)
        lines = ran.stderr.splitlines()
        assert ran.returncode == 1 and len(lines) == 1, (name, ran.stderr)
        assert lines[0].startswith(f"pdctl {name}: needs the '{sub.extra}' extra ("), lines[0]
