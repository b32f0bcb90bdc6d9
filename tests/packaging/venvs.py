"""Install the package into fresh virtual environments, as `pip install .` and the images do, cheaply.

pip runs offline against a wheelhouse kept in ~/.cache/pd-operator-tests/wheels (PD_TEST_WHEELHOUSE
moves it), so each install takes seconds instead of downloading some 40 distributions again. When the
wheelhouse cannot satisfy an install (first run, a new or re-pinned dependency), it is filled once from
the package index and the install is run again, still offline.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.packaging.declared import REPO

WHEELHOUSE = Path(os.environ.get("PD_TEST_WHEELHOUSE", Path.home() / ".cache" / "pd-operator-tests" / "wheels"))
# pyproject's build-system, for offline builds, and mypy, which the backend adds where it compiles the proxy
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel", "mypy>=1.15,<3")
# what `pip install .` reads
SOURCE = ("pyproject.toml", "README.md", "setup.py", "build_backend", "operator", "runtime")
NO_COMPILER = {"CC": "/nonexistent/cc"}
"""An install's environment as on a machine without a C compiler: the proxy is installed as Python."""
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def copy_source(target: Path) -> Path:
    """The files a build of the package reads, copied so that pip builds nothing inside the checkout."""
    target.mkdir(parents=True, exist_ok=True)
    for name in SOURCE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, target / name, dirs_exist_ok=True, ignore=IGNORE)
        else:
            shutil.copy2(path, target / name)
    return target


@contextmanager
def _wheelhouse_lock(exclusive: bool) -> Iterator[None]:
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    with (WHEELHOUSE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def _fill_wheelhouse(source: Path, extras: Iterable[str]) -> None:
    wanted = ",".join(sorted(extras))
    requirement = f"{source}[{wanted}]" if wanted else str(source)
    with _wheelhouse_lock(exclusive=True):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(WHEELHOUSE), requirement, *BUILD_REQUIREMENTS],
            check=True,
            timeout=900,
        )
        for built in WHEELHOUSE.glob("pd_operator-*.whl"):  # always built from the source under test
            built.unlink()


def run_install(command: str, env: dict[str, str], source: Path, extras: Iterable[str]) -> None:
    """Run an install command (bash, with ``env`` added to ours) offline against the wheelhouse; fill it
    from the index and retry once if that fails."""
    offline = {**os.environ, **env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    offline.pop("VIRTUAL_ENV", None)
    for attempt in ("wheelhouse as found", "wheelhouse filled"):
        with _wheelhouse_lock(exclusive=False):
            result = subprocess.run(
                ["bash", "-c", command], env=offline, capture_output=True, text=True, timeout=900, check=False
            )
        if result.returncode == 0:
            return
        if attempt == "wheelhouse as found":
            _fill_wheelhouse(source, extras)
    raise AssertionError(f"install failed: {command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def present_modules(python: Path, modules: Iterable[str]) -> set[str]:
    """Which of these top-level modules the interpreter can import (found without importing them)."""
    script = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    result = subprocess.run([str(python), "-c", script, *modules], capture_output=True, text=True, check=True)
    return set(result.stdout.split())
