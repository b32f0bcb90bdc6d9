"""The proxy's request path: compiled by mypyc in a wheel build with a C compiler, Python everywhere else
(an editable install, a machine without a compiler); docs/proxy.md, "Compiled request path"."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
from pathlib import Path

import pytest

from build_backend import pd_build
from tests.packaging.venvs import NO_COMPILER, copy_source, run_install

MODULES = [path.removesuffix(".py").replace("/", ".") for path in pd_build.COMPILED]


def test_every_module_to_compile_exists() -> None:
    root = Path(pd_build.__file__).parents[1] / "runtime"
    assert [path for path in pd_build.COMPILED if not (root / path).is_file()] == []


def _awaits_in_handlers(source: str) -> list[int]:
    """Lines of the awaits (``await``, ``async with``, ``async for``) inside an except or finally clause of
    a coroutine."""
    lines = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            clauses = [node.body] if isinstance(node, ast.ExceptHandler) else []
            clauses += [node.finalbody] if isinstance(node, ast.Try) else []
            for stmt in (stmt for clause in clauses for stmt in clause):
                awaits = (ast.Await, ast.AsyncWith, ast.AsyncFor)
                lines += [sub.lineno for sub in ast.walk(stmt) if isinstance(sub, awaits)]
    return lines


@pytest.mark.parametrize("path", pd_build.COMPILED)
def test_no_compiled_coroutine_awaits_inside_an_except_or_finally_clause(path: str) -> None:
    """mypyc makes a caught exception the thread's handled one: a coroutine suspended in its clause leaves
    it set for every other callback of the loop (http1 then took it for a parser refusal's cause), and an
    await in a finally clause lost the exception to re-raise (docs/proxy.md, "Compiled request path")."""
    source = (Path(pd_build.__file__).parents[1] / "runtime" / path).read_text()
    assert _awaits_in_handlers(source) == []


@pytest.mark.parametrize("module", MODULES)
def test_the_editable_install_runs_the_python_files(module: str) -> None:
    """What `make venv` installs: the sources run as they are, so an edit takes effect at once."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None and spec.origin.endswith(".py"), spec


def test_the_backend_compiles_where_a_compiler_is_found_or_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PD_COMPILE_PROXY", raising=False)
    for name, value in NO_COMPILER.items():
        monkeypatch.setenv(name, value)
    assert not pd_build.compiler_found() and not pd_build.compiles()
    monkeypatch.setenv("PD_COMPILE_PROXY", "1")
    assert pd_build.compiles()
    monkeypatch.setenv("PD_COMPILE_PROXY", "0")
    monkeypatch.setenv("CC", "sh")
    assert pd_build.compiler_found() == Path(pd_build.sysconfig.get_paths()["include"], "Python.h").is_file()
    assert not pd_build.compiles()
    monkeypatch.setenv("PD_COMPILE_PROXY", "yes")
    with pytest.raises(ValueError, match="PD_COMPILE_PROXY"):
        pd_build.compiles()


def _origins(python: Path) -> dict[str, str]:
    script = "import importlib, sys; [print(m, importlib.import_module(m).__file__) for m in sys.argv[1:]]"
    out = subprocess.run([str(python), "-c", script, *MODULES], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


_BUILD_SERVER = """import os, sys
from pd_runtime.proxy.cli import build_parser, config_from_args
from pd_runtime.proxy.server import ProxyServer
ProxyServer(config_from_args(build_parser().parse_args(sys.argv[1:]), dict(os.environ)))
print("built")
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_wheel_built_with_a_compiler_runs_the_compiled_modules(tmp_path: Path) -> None:
    """`pip install '.[proxy]'` with PD_COMPILE_PROXY=1 (which fails rather than fall back): every listed
    module is an extension, and the proxy's server is built from them (its metrics' collectors broke there
    when the build could not see prometheus_client's types)."""
    source = copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    command = f'python3 -m venv "{venv}" && "{venv}/bin/pip" install -q "{source}[proxy]"'
    run_install(command, {"PD_COMPILE_PROXY": "1"}, source, ["proxy"])
    origins = _origins(venv / "bin" / "python")
    assert {m: o for m, o in origins.items() if not o.endswith(".so")} == {}
    ran = subprocess.run([str(venv / "bin" / "pdctl"), "proxy", "--help"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _BUILD_SERVER, "--registration-address", "tcp://127.0.0.1:5557"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0 and ran.stdout == "built\n", ran.stderr
