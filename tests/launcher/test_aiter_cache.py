"""Seeding AITER's JIT directory with the image's prebuilt modules (links, never copies)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pd_runtime import aiter_cache


def _package(root: Path, modules: list[str]) -> Path:
    jit = root / "aiter" / "jit"
    jit.mkdir(parents=True)
    (root / "aiter" / "__init__.py").write_text("raise ImportError('AITER code must not run in the launcher')\n")
    for name in modules:
        (jit / name).write_text("elf")
    return jit


def test_missing_modules_are_linked_and_built_ones_kept(tmp_path: Path) -> None:
    jit = _package(tmp_path / "site", ["module_aiter_core.so", "module_rmsnorm.so"])
    cache = tmp_path / "cache" / "aiter-abc"
    cache.mkdir(parents=True)
    (cache / "module_rmsnorm.so").write_text("built at run time")  # AITER rebuilt it here: keep it
    assert aiter_cache.seed(cache, sorted(jit.glob("*.so"))) == 1
    assert (cache / "module_aiter_core.so").resolve() == jit / "module_aiter_core.so"
    assert (cache / "module_rmsnorm.so").read_text() == "built at run time"
    assert aiter_cache.seed(cache, sorted(jit.glob("*.so"))) == 0  # the next start links nothing again


def test_links_to_modules_the_image_no_longer_has_are_dropped(tmp_path: Path) -> None:
    jit = _package(tmp_path / "site", ["module_gone.so"])
    cache = tmp_path / "cache"
    aiter_cache.seed(cache, [jit / "module_gone.so"])
    (jit / "module_gone.so").unlink()
    aiter_cache.seed(cache, [])
    assert not list(cache.iterdir())


def test_prepare_finds_the_installed_package_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path / "site", ["module_aiter_core.so"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    aiter_cache.prepare({"AITER_JIT_DIR": str(cache)})
    assert (cache / "module_aiter_core.so").is_symlink() and "aiter" not in sys.modules
    aiter_cache.prepare({})  # unset: nothing to do
