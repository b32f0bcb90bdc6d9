"""What `pdctl` loads, seen from a fresh interpreter: the dispatcher imports a subcommand only when it
runs, a subcommand loads only its own extra, and a missing extra is one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pd_operator import command_lines
from pd_operator.validation import validate_spec
from pd_runtime.bench.calibration_server import Behaviour
from pd_runtime.cli import SUBCOMMANDS
from tests.bench.conftest import ServerThread
from tests.packaging.declared import REPO, TOOL_EXTRAS, declared_in, extras, installed_by

# Run pdctl's main in this interpreter with argv[1:] and report what got imported; sys.argv[1] may name
# modules to hide first, as if they were not installed ("-" for none).
PROBE = """
import contextlib, io, json, sys
for hidden in filter(None, sys.argv[1].split(",")):
    sys.modules[hidden] = None
from pd_runtime.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[2:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "stderr": err.getvalue(), "modules": sorted(sys.modules)}))
"""

# Top-level modules of each distribution an extra (not the base install) declares.
EXTRA_MODULES = {
    "kopf": "kopf",
    "kubernetes": "kubernetes",
    "httpx": "httpx",
    "pydantic": "pydantic",
    "pyyaml": "yaml",
    "msgpack": "msgpack",
    "pyzmq": "zmq",
    "prometheus-client": "prometheus_client",
    "matplotlib": "matplotlib",
    "uvloop": "uvloop",
    "orjson": "orjson",
    "httptools": "httptools",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry",
}


@dataclass(frozen=True)
class Probe:
    code: int
    stderr: str
    modules: frozenset[str]

    @property
    def packages(self) -> set[str]:
        return {module.partition(".")[0] for module in self.modules}


def probe(*argv: str, hide: tuple[str, ...] = ()) -> Probe:
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(hide), *argv], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(ran.stdout)
    return Probe(report["code"], report["stderr"], frozenset(report["modules"]))


def test_the_module_table_covers_every_distribution_an_extra_declares() -> None:
    runtime_extras = set(extras()) - TOOL_EXTRAS
    assert set(EXTRA_MODULES) == installed_by(runtime_extras) - declared_in(None)


def test_pdctl_help_imports_no_subcommand() -> None:
    report = probe("--help")
    assert report.code == 0
    assert {m for m in report.modules if m.startswith(("pd_runtime.", "pd_operator"))} == {"pd_runtime.cli"}
    assert not report.packages & {*EXTRA_MODULES.values(), "aiohttp"}


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_a_subcommands_help_loads_nothing_from_another_extra(name: str) -> None:
    report = probe(name, "--help")
    assert report.code == 0, report.stderr
    own = installed_by([SUBCOMMANDS[name].extra])
    foreign = {module for dist, module in EXTRA_MODULES.items() if dist not in own}
    assert not report.packages & foreign


def test_bench_help_does_not_load_matplotlib() -> None:
    """The issue's case: every probe Job paid half a second for matplotlib it never used."""
    report = probe("bench", "--help")
    assert report.code == 0
    assert "matplotlib" not in report.packages and "pd_runtime.bench.cli" in report.modules


@pytest.mark.parametrize(
    ("argv", "hide", "extra"),
    [
        (("proxy", "--help"), ("zmq",), "proxy"),
        (("sim-engine", "--help"), ("zmq",), "sim"),
        (("crd",), ("pydantic",), "api"),
        (("operator", "--all-namespaces", "--standalone"), ("kopf",), "operator"),
        (("bench", "--plot", "out.png", "RESULT"), ("matplotlib",), "plot"),
        (("proxy", "--loop", "uvloop"), ("uvloop",), "fast"),
    ],
)
def test_a_missing_extra_is_one_line_that_names_it(
    argv: tuple[str, ...], hide: tuple[str, ...], extra: str, tmp_path: Path
) -> None:
    result = tmp_path / "result.json"  # a plot needs one readable result before it needs matplotlib
    result.write_text(json.dumps({"rate": 1.0, "attainment": 1.0, "attainment_ci": [0.9, 1.0]}))
    report = probe(*(str(result) if arg == "RESULT" else arg for arg in argv), hide=hide)
    assert report.code == 1
    assert report.stderr == (
        f"pdctl {argv[0]}: needs the '{extra}' extra ({hide[0]} is not installed): pip install 'pd-operator[{extra}]'\n"
    )


def test_a_missing_module_of_the_project_itself_is_not_blamed_on_an_extra() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, "pd_runtime.bench.runner", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1 and "ModuleNotFoundError: import of pd_runtime.bench.runner halted" in ran.stderr


def test_a_goodput_probe_run_does_not_load_matplotlib(tmp_path: Path) -> None:
    """The probe Job's own command line, as the operator renders it, run to completion."""
    spec = validate_spec(yaml.safe_load((REPO / "examples" / "simulated-write.yaml").read_text())["spec"])
    server = ServerThread(Behaviour(ttft_s=0.01, itl_s=0.001))
    summary = tmp_path / "termination-log"
    try:
        command = command_lines.bench_command(spec, server.url)
        report = probe(*(str(summary) if arg == command_lines.TERMINATION_LOG else arg for arg in command[1:]))
    finally:
        server.stop()
    assert report.code == 0, report.stderr
    assert json.loads(summary.read_text())["requests"] == spec.goodput_probe.requests
    assert "matplotlib" not in report.packages
