"""Ports for the servers a test starts: held from the test's choice until its end (tests/conftest.py
releases them), so no other process on the shared machine takes one before the server binds it."""

from __future__ import annotations

from pd_runtime.localports import PortReservation

TEST_PORTS = PortReservation()
