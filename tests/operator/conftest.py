"""Shared helpers of the operator tests: example files and the seed's golden command lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator.policy import DEFAULT_TOLERATION_KEYS, SERVICE_TYPES, HostPathPrefix, TenancyPolicy

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def load_example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return doc


@pytest.fixture
def repo() -> Path:
    return REPO


# Strategy dra on the 8 GPUs of an MI300X node, pinned by PCI address (admission requires the addresses).
PCI_ADDRESSES = [f"0000:{b:02x}:00.0" for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)]
DRA: dict[str, Any] = {"strategy": "dra", "dra": {"pciAddresses": PCI_ADDRESSES}}

# A tenancy policy wide enough for the variants that switch on what the default policy refuses (the
# written-keys and render tests cover those parts too); tests/operator/test_policy.py tests the rules.
WIDE_POLICY = TenancyPolicy(
    host_paths=(HostPathPrefix(path_prefix="/", read_only=False),),
    toleration_keys=("gpu", *DEFAULT_TOLERATION_KEYS),
    priority_class_names=("high",),
    service_account_names=("serving",),
    allow_privileged=True,
    allow_service_account_tokens=True,
    service_types=SERVICE_TYPES,
)
