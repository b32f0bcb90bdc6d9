"""The API's validation: every invalid spec of the shared table is refused with its message."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator.api import API_VERSION, KIND, PDDeploymentSpec
from pd_operator.api.serving import PROXY_MANAGED_FLAGS
from pd_operator.commands.render import objects_for
from pd_operator.validation import SpecError, validate_spec
from pd_operator.vllm_flags import sets_compilation_config
from tests.operator.conftest import EXAMPLES, load_example
from tests.operator.flag_spellings import ACCEPTED, COMPILATION_CONFIG, REFUSED
from tests.operator.spec_table import load_cases, load_table, merge_patch, name_of, patched

CASES = load_cases()


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 20
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_base_of_the_table_is_valid() -> None:
    validate_spec(load_table()["base"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_invalid_spec_is_refused_with_its_message(case: dict[str, Any]) -> None:
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name_of(case)}, "spec": patched(case)}
    with pytest.raises(SpecError) as err:
        objects_for(doc, None)
    lines = err.value.problems
    assert any(line.startswith(case["field"] + ":") and case["message"] in line for line in lines), lines


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid(path: Any) -> None:
    validate_spec(load_example(path.name)["spec"])


def test_merge_patch_removes_keys_with_null() -> None:
    assert merge_patch({"a": 1, "b": {"c": 2}}, {"a": None, "b": {"d": 3}}) == {"b": {"c": 2, "d": 3}}


def test_defaults_are_the_seed_experiment() -> None:
    spec = PDDeploymentSpec.model_validate({"model": "m", "kvTransfer": {"rdma": {"resourceName": "rdma/x"}}})
    assert (spec.prefill.gpus, spec.decode.gpus) == ("0-3", "4-7")
    assert (spec.prefill.ports.http, spec.prefill.ports.handshake, spec.prefill.ports.notify) == (20005, 6301, 6105)
    assert (spec.decode.ports.http, spec.decode.ports.handshake, spec.decode.ports.notify) == (40005, 7301, 7501)
    assert spec.proxy.registration_port == 36367
    assert (spec.kv_transfer.transfer_mode, spec.kv_transfer.backend) == ("write", "rdma")
    assert spec.gpu_allocation.strategy == "devicePlugin" and spec.node.gpus_per_node == 8


def test_every_problem_is_reported_not_only_the_first() -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({"model": "m", "engine": "simulated", "mode": "sideways", "proxy": {"port": 0}})
    assert len(err.value.problems) == 2


def test_non_mapping_spec_is_an_error_not_a_crash() -> None:
    with pytest.raises(SpecError):
        validate_spec(["not", "a", "mapping"])


def test_user_env_replaces_operator_value_but_duplicates_are_refused() -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({"model": "m", "engine": "simulated", "prefill": {"env": [{"name": "A"}, {"name": "A"}]}})
    assert "Duplicate value" in str(err.value)


def test_write_example_without_the_rdma_resource_is_refused_naming_the_fix() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    del spec["kvTransfer"]["rdma"]["resourceName"]
    assert spec["kvTransfer"]["rdma"]["hostNetwork"] is True
    with pytest.raises(SpecError) as err:
        validate_spec(spec)
    assert err.value.problems == [
        "spec.kvTransfer.rdma.resourceName: kvTransfer.backend rdma needs an RDMA device in the engine containers: "
        "set kvTransfer.rdma.resourceName, e.g. rdma/hca_shared_devices_a or amd.com/nic; hostNetwork brings no "
        "/dev/infiniband"
    ]


def test_privileged_host_devices_need_no_rdma_resource() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    del spec["kvTransfer"]["rdma"]["resourceName"]
    validate_spec({**spec, "gpuAllocation": {"strategy": "hostDevices"}})


@pytest.mark.parametrize(("tp", "dp"), [(1, 4), (4, 1), (1, 1)])
def test_one_parallel_dimension_per_role_is_accepted(tp: int, dp: int) -> None:
    gpus = "0-3" if tp * dp == 4 else "0"
    validate_spec(
        {
            "model": "m",
            "engine": "simulated",
            "engineVersion": "0.34.0",  # decode stays TP4: write mode between TP sizes
            "prefill": {"gpus": gpus, "tensorParallelSize": tp, "dataParallelSize": dp},
        }
    )


@pytest.mark.parametrize("handshake", [32764, 61000])
def test_rank_ports_just_outside_the_ephemeral_range_are_accepted(handshake: int) -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["decode"]["ports"] = {"http": 40005, "handshake": handshake, "notify": 7501}
    validate_spec(spec)


def test_ephemeral_rank_ports_are_fine_for_simulated_engines() -> None:
    validate_spec(
        {"model": "m", "engine": "simulated", "decode": {"ports": {"http": 40005, "handshake": 40100, "notify": 40200}}}
    )


def _with_prefill_args(words: tuple[str, ...]) -> dict[str, Any]:
    return {**load_table()["base"], "prefill": {"extraArgs": list(words)}}


@pytest.mark.parametrize("words", list(REFUSED), ids=" ".join)
def test_extra_args_setting_a_managed_flag_are_refused_in_every_spelling_vllm_reads(words: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(_with_prefill_args(words))
    assert any(
        line.startswith("spec.prefill.extraArgs[0]: ") and "is managed by the operator" in line
        for line in err.value.problems
    ), err.value.problems


@pytest.mark.parametrize("word", [w for flag in PROXY_MANAGED_FLAGS for w in (flag, f"{flag}=x")])
def test_proxy_extra_args_setting_a_managed_flag_are_refused(word: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({**load_table()["base"], "proxy": {"extraArgs": ["--log-level", "DEBUG", word]}})
    flag = word.split("=")[0]
    assert err.value.problems == [
        f"spec.proxy.extraArgs[2]: {flag} is managed by the operator: a pdctl proxy flag of the addresses, engines "
        "or keys it renders (docs/security.md lists them)"
    ]


def test_proxy_extra_args_of_other_flags_are_taken() -> None:
    words = ["--log-level=DEBUG", "--max-body-bytes", "1048576", "--policy", "least_load"]
    validate_spec({**load_table()["base"], "proxy": {"extraArgs": words}})


@pytest.mark.parametrize("words", ACCEPTED, ids=" ".join)
def test_extra_args_of_other_flags_are_taken(words: tuple[str, ...]) -> None:
    validate_spec(_with_prefill_args(words))


@pytest.mark.parametrize("words", COMPILATION_CONFIG, ids=" ".join)
def test_a_compilation_config_is_seen_in_every_spelling_vllm_reads(words: tuple[str, ...]) -> None:
    assert sets_compilation_config(list(words))
