"""Helpers for the chart tests: locating helm, rendering the chart, syncing the chart's CRD copy.

The helm binaries come from e2e/build-control-plane.sh, the same script CI runs before the e2e suite,
so the tests use exactly the helm v3 and v4 versions the project pins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pd-operator"
SOURCE_CRD = REPO / "crds" / "pddeployment.yaml"
CHART_CRD = CHART / "crds" / "pddeployment.yaml"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
VALUES_DIR = Path(__file__).resolve().parent / "values"
BUILD_SCRIPT = REPO / "e2e" / "build-control-plane.sh"

KEEP_ANNOTATION = "helm.sh/resource-policy"
RELEASE = "pd"
NAMESPACE = "pd-system"
KUBE_VERSION = "1.36.3"
# Set to 1 to rewrite golden files and the chart's CRD copy instead of comparing against them.
UPDATE_ENV = "PD_UPDATE_GOLDEN"
# A directory holding helm3/helm4, to skip running the build script (e.g. while it is still building).
BIN_DIR_ENV = "PD_E2E_BIN"


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def locate_helm_binaries(build_timeout_s: float) -> tuple[dict[str, Path], str]:
    """Return {"helm3": path, "helm4": path} (those found) and how they were found, for skip reasons."""
    bin_dir = os.environ.get(BIN_DIR_ENV)
    how = f"${BIN_DIR_ENV}={bin_dir}"
    if not bin_dir:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=build_timeout_s, check=False
        )
        lines = result.stdout.strip().splitlines()
        bin_dir = lines[-1] if result.returncode == 0 and lines else ""
        how = f"{BUILD_SCRIPT.name} exited {result.returncode}: {result.stderr.strip()[-300:]}"
    found = {name: Path(bin_dir) / name for name in ("helm3", "helm4") if bin_dir}
    found = {name: path for name, path in found.items() if os.access(path, os.X_OK)}
    if not found and (on_path := shutil.which("helm")):
        found = {"helm": Path(on_path)}
    return found, how


def run_helm(helm: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)


def template_args(values_files: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for path in values_files:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return args


def render(helm: Path, values_files: Sequence[Path] = (), sets: Sequence[str] = ()) -> str:
    result = run_helm(helm, template_args(values_files, sets))
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return result.stdout


def documents(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def find(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def with_keep_annotation(crd: dict[str, Any]) -> dict[str, Any]:
    """The chart's copy of a CRD: identical, plus the annotation that keeps it on `helm uninstall`."""
    metadata = dict(crd["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), KEEP_ANNOTATION: "keep"}
    return {**crd, "metadata": metadata}


def without_keep_annotation(crd: dict[str, Any]) -> dict[str, Any]:
    metadata = dict(crd["metadata"])
    annotations = {k: v for k, v in metadata.get("annotations", {}).items() if k != KEEP_ANNOTATION}
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    return {**crd, "metadata": metadata}


def write_chart_crd() -> None:
    header = "# Generated from crds/pddeployment.yaml (`pdctl crd`) by tests/chart; do not edit.\n"
    header += f"# Regenerate: {UPDATE_ENV}=1 .venv/bin/pytest -q tests/chart\n"
    crd = with_keep_annotation(yaml.safe_load(SOURCE_CRD.read_text()))
    CHART_CRD.write_text(header + yaml.safe_dump(crd, sort_keys=False, width=120))
