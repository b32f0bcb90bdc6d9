from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart_helpers import BIN_DIR_ENV, locate_helm_binaries

# A cold machine builds helm (and the control plane) on first use; a warm one returns at once.
BUILD_TIMEOUT_S = 3000.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give chart tests room for a cold helm build in the session fixture that the first one triggers."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 120))


@pytest.fixture(scope="session")
def helm_binaries() -> dict[str, Path]:
    found, how = locate_helm_binaries(BUILD_TIMEOUT_S)
    if not found:
        pytest.skip(
            f"no helm binary: e2e/build-control-plane.sh gave none ({how}), none on PATH; "
            f"run `make control-plane` or set {BIN_DIR_ENV}"
        )
    return found


@pytest.fixture(scope="session")
def helm(helm_binaries: dict[str, Path]) -> Path:
    """One helm for tests whose result cannot depend on the helm version (the golden tests use both)."""
    return next(iter(helm_binaries.values()))
