"""AITER's JIT directory on the cache volume, seeded with the modules the image ships prebuilt.

With ``AITER_JIT_DIR`` set, AITER builds its modules there and imports them from there only
(``get_user_jit_dir`` and ``get_module`` in ROCm/aiter ``aiter/jit/core.py``); the modules vLLM's ROCm
image prebuilds into the package (``PREBUILD_KERNELS=1`` in vLLM's ``docker/Dockerfile.rocm_base``)
would be compiled again. So before the engine starts, the launcher links each prebuilt ``<module>.so``
of the installed package into the directory where none is there yet, and drops links whose target is
gone (an image without that module). Modules AITER compiles at run time land beside them and survive
restarts. The operator names the directory after the image, so modules of another image never load.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

JIT_DIR_ENV = "AITER_JIT_DIR"


def prebuilt_modules() -> list[Path]:
    """The installed AITER package's prebuilt modules (none without AITER); imports no AITER code."""
    spec = importlib.util.find_spec("aiter")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted((Path(next(iter(spec.submodule_search_locations))) / "jit").glob("*.so"))


def seed(jit_dir: Path, prebuilt: Iterable[Path]) -> int:
    """Link the prebuilt modules ``jit_dir`` lacks; returns how many were linked."""
    jit_dir.mkdir(parents=True, exist_ok=True)
    for entry in jit_dir.iterdir():
        if entry.is_symlink() and not entry.exists():
            entry.unlink()
    linked = 0
    for module in prebuilt:
        link = jit_dir / module.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(module)
            linked += 1
    return linked


def prepare(environ: Mapping[str, str]) -> None:
    """Seed ``$AITER_JIT_DIR`` when it is set; a failure is logged, never fatal (AITER then compiles)."""
    target = environ.get(JIT_DIR_ENV)
    if not target:
        return
    try:
        linked = seed(Path(target), prebuilt_modules())
    except OSError as exc:
        log.warning("cannot prepare %s=%s: %s", JIT_DIR_ENV, target, exc)
        return
    if linked:
        log.info("linked %d prebuilt AITER module(s) into %s", linked, target)
