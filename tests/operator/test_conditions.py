"""The table of conditions (conditions.py): complete, what Ready waits for, and the check that holds code to it.

conftest's ``conditions_declared`` checks every condition any operator test makes the operator build; the
tests here check the table itself and that the check would catch a condition outside it.
"""

from __future__ import annotations

from typing import get_args

from pd_operator import conditions, layout, observe, policy
from pd_operator.api import Condition
from pd_operator.validation import validate_spec
from tests.operator.conftest import undeclared

OWNER = layout.Owner(name="demo", namespace="ns1", uid="uid-1", generation=1)


def test_each_type_is_declared_once_with_reasons_a_setter_and_a_meaning() -> None:
    types = [kind.type for kind in conditions.TABLE]
    assert len(types) == len(set(types))
    for kind in conditions.TABLE:
        assert kind.reasons and len(kind.reasons) == len(set(kind.reasons)), kind.type
        assert kind.set_by and kind.meaning.endswith("."), kind.type


def test_ready_waits_for_the_spec_and_the_readiness_of_each_role_the_pod_runs() -> None:
    disaggregated = layout.build(OWNER, validate_spec({"model": "m", "engine": "simulated"}))
    colocated = layout.build(OWNER, validate_spec({"model": "m", "engine": "simulated", "mode": "colocated"}))
    assert observe.ready_set(disaggregated).dependents == ("SpecValid", "PrefillReady", "DecodeReady", "ProxyReady")
    assert observe.ready_set(colocated).dependents == ("SpecValid", "EngineReady", "ProxyReady")
    assert observe.ready_set(colocated).happy == conditions.READY.type


def test_children_admitted_declares_every_reason_a_refusal_can_have() -> None:
    assert set(get_args(conditions.RefusalReason)) < set(conditions.CHILDREN_ADMITTED.reasons)


def test_spec_valid_reasons_are_its_own_and_the_tenancy_policys_rules() -> None:
    for reason in ("Valid", "InvalidSpec", *(rule.rule for rule in policy.RULES)):
        assert undeclared(Condition(type="SpecValid", status="False", reason=reason)) is None, reason


def test_the_check_catches_an_undeclared_type_or_reason() -> None:
    assert undeclared(Condition(type="KVTransferVerified", status="True", reason="TransferCompleted")) is None
    assert undeclared(Condition(type="KVTransferVerified", status="False", reason="Unverified"))
    assert undeclared(Condition(type="Drained", status="True", reason="Drained"))
    assert undeclared(Condition(type="ProxyReady", status="False", reason="HostPathNotAllowed"))
