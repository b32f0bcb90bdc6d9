"""What pyproject.toml cannot say: in a wheel build that asks for it, the proxy's request path compiled by
mypyc (build_backend/pd_build.py decides; docs/proxy.md, "Compiled request path").

The Python files stay the source: mypyc compiles them as they are, and a build that cannot (no compiler,
or a module mypyc refuses) installs them as Python unless ``PD_COMPILE_PROXY=1`` asked for the compiled
build, which then fails instead.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_backend"))
from pd_build import COMPILED, compile_mode  # the backend's own module

REQUIRED = compile_mode() == "1"


def _warn(what: str) -> None:
    sys.stderr.write(f"pd-operator: {what}; the proxy's modules are installed as Python\n")


def extensions() -> list[object]:
    if os.environ.get("PD_BUILD_COMPILED") != "1":
        return []
    try:
        from mypyc.build import mypycify

        # Only these flags: the project's mypy configuration names plugins of the dev install
        flags = ["--config-file=", "--ignore-missing-imports", "--strict-bytes"]
        return list(
            mypycify(
                [*flags, *(f"runtime/{path}" for path in COMPILED)],
                group_name="pd_runtime_compiled",
            )
        )
    except (Exception, SystemExit) as exc:  # mypyc reports a module it cannot compile by exiting
        if REQUIRED:
            raise
        _warn(f"mypyc could not compile the proxy ({exc!r})")
        return []


class BuildExt(build_ext):
    """Without ``PD_COMPILE_PROXY=1``, a C compiler's failure leaves the Python modules in place."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            _warn(f"the C compiler failed ({exc!r})")
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
