"""Shared helpers of the operator tests: example files, the seed's golden command lines, and the check
that every condition a test makes the operator write is declared in conditions.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator import conditions, observe
from pd_operator.api import Condition
from pd_operator.policy import DEFAULT_TOLERATION_KEYS, RULES, SERVICE_TYPES, HostPathPrefix, TenancyPolicy

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


# The RDMA examples that share the node's network namespace: the default tenancy policy refuses them, the
# administrator's opt-in (policy.allowHostNetwork) admits them.
HOST_NETWORK_EXAMPLES = frozenset({"qwen3-235b-write", "qwen3-235b-2p1d"})


def render_argv(example: Path, tmp_path: Path) -> list[str]:
    """``pdctl render`` of an example as its administrator would run it: with the opt-in it documents."""
    if example.stem not in HOST_NETWORK_EXAMPLES:
        return [str(example)]
    opt_in = tmp_path / "policy.yaml"
    opt_in.write_text("allowHostNetwork: true\n")
    return [str(example), "--policy", str(opt_in)]


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
    allow_host_network=True,
    service_types=SERVICE_TYPES,
)


# SpecValid's reasons beyond its own: the tenancy policy's rules (its ``more_reasons``).
POLICY_REASONS = frozenset(rule.rule for rule in RULES)


def undeclared(cond: Condition) -> str | None:
    """Why ``cond`` is not one conditions.TABLE declares (its type, or its reason for that type), if so."""
    kind = next((k for k in conditions.TABLE if k.type == cond.type), None)
    if kind is None:
        return f"condition type {cond.type} is not in conditions.TABLE"
    extra = POLICY_REASONS if kind is conditions.SPEC_VALID else frozenset()
    if cond.reason not in kind.reasons and cond.reason not in extra:
        return f"{cond.type} has reason {cond.reason}, which conditions.TABLE does not declare for it"
    return None


@pytest.fixture(autouse=True)
def conditions_declared(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Condition]]:
    """Every condition the operator builds in any operator test (observe.condition: observe's and decide's)
    must be declared, so a new type or reason cannot slip past the table and docs/crd-reference.md."""
    built: list[Condition] = []
    build = observe.condition

    def recorded(*args: Any) -> Condition:
        built.append(build(*args))
        return built[-1]

    monkeypatch.setattr(observe, "condition", recorded)
    yield built
    problems = sorted({why for cond in built if (why := undeclared(cond))})
    assert not problems, problems
