"""Fixtures for every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ports import TEST_PORTS


@pytest.fixture(autouse=True)
def _release_test_ports() -> Iterator[None]:
    """The servers a test started hold their ports themselves by its end."""
    yield
    TEST_PORTS.release()
