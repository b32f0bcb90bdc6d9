"""The package's PEP 517 build backend: setuptools', which compiles the proxy's request path with mypyc in
wheel builds (``pip install .``) where a C compiler is found (setup.py; docs/proxy.md, "Compiled request
path"). Editable installs (``pip install -e``, ``make venv``) never compile and never install mypy: the
Python files stay the code that runs, so edits take effect at once.

``PD_COMPILE_PROXY``: ``auto`` (unset: compile where a compiler is found, else pure Python), ``1`` (compile
or fail the build), ``0`` (pure Python).
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  # the hooks served unchanged
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

MYPY = "mypy>=1.15,<3"
"""mypyc comes with mypy."""
BASES = ("prometheus-client>=0.20",)
"""The packages whose classes compiled classes subclass (``metrics.py``'s collectors): mypyc must see
their types. Without them it took ``Collector`` for ``Any`` and built collectors that broke the proxy's
start (``SystemError`` in the registry's ``describe`` lookup)."""

COMPILED = (
    "pd_runtime/openai_api.py",
    "pd_runtime/protocol.py",
    "pd_runtime/proxy/admission.py",
    "pd_runtime/proxy/admission_gate.py",
    "pd_runtime/proxy/affinity.py",
    "pd_runtime/proxy/api.py",
    "pd_runtime/proxy/breaker.py",
    "pd_runtime/proxy/circuits.py",
    "pd_runtime/proxy/contract.py",
    "pd_runtime/proxy/deadline.py",
    "pd_runtime/proxy/demand.py",
    "pd_runtime/proxy/disaggregation.py",
    "pd_runtime/proxy/errors.py",
    "pd_runtime/proxy/flows.py",
    "pd_runtime/proxy/http1.py",
    "pd_runtime/proxy/jsoncodec.py",
    "pd_runtime/proxy/legs.py",
    "pd_runtime/proxy/metrics.py",
    "pd_runtime/proxy/migration.py",
    "pd_runtime/proxy/placement.py",
    "pd_runtime/proxy/registry.py",
    "pd_runtime/proxy/relay.py",
    "pd_runtime/proxy/routing.py",
    "pd_runtime/proxy/sinks.py",
    "pd_runtime/proxy/timer.py",
    "pd_runtime/proxy/upstream.py",
)
"""The modules a client request runs through (server.py stays Python: aiohttp's middleware decorator sets
an attribute on its function, which a compiled function does not take; its API port's handlers are api.py)."""


def compile_mode() -> str:
    mode = os.environ.get("PD_COMPILE_PROXY", "auto").strip().lower() or "auto"
    if mode not in ("auto", "1", "0"):
        raise ValueError(f"PD_COMPILE_PROXY must be auto, 1 or 0, not {mode!r}")
    return mode


def compiler_found() -> bool:
    """A C compiler (``CC``, else the one Python was built with) and Python's headers."""
    command = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return bool(command) and shutil.which(command[0]) is not None and headers.is_file()


def compiles() -> bool:
    mode = compile_mode()
    return mode == "1" or (mode == "auto" and compiler_found())


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = [MYPY, *BASES] if compiles() else []
    return [*build_meta.get_requires_for_build_wheel(config_settings), *extra]


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    os.environ["PD_BUILD_COMPILED"] = "1" if compiles() else "0"  # read by setup.py, run in this process
    return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    os.environ["PD_BUILD_COMPILED"] = "0"
    return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
