"""spec.engineVersion: what each supported vLLM line gets rendered, and what its launcher is told to check."""

from __future__ import annotations

import pytest

from pd_operator.command_lines import (
    accepted_by,
    engine_command,
    engine_containers,
    engine_env,
    kv_transfer_config,
)
from pd_operator.validation import validate_spec
from pd_runtime.sim.versions import VERSION_ENV as SIM_VLLM_VERSION_ENV
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import SUPPORTED, release
from tests.operator.conftest import load_example

# Fields KVTransferConfig had until 0.31 and refuses from 0.32 (it forbids unknown fields).
REMOVED_IN_0_32 = {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"}


def spec_in(example: str, version: str | None, **changes: object) -> object:
    spec = load_example(example)["spec"] | changes
    if version is not None:
        spec["engineVersion"] = version
    return validate_spec(spec)


@pytest.mark.parametrize("example", ["qwen3-235b-write.yaml", "simulated-read.yaml"])
@pytest.mark.parametrize("line", [r.name for r in SUPPORTED])
def test_every_supported_line_gets_only_kv_transfer_keys_it_accepts(example: str, line: str) -> None:
    spec = spec_in(example, f"{line}.0")
    for eng in engine_containers(spec):
        keys = set(kv_transfer_config(spec, eng))
        assert keys <= release(line).kv_transfer_config_fields
        assert not keys & REMOVED_IN_0_32


def test_a_key_the_line_refuses_is_never_rendered_silently() -> None:
    config = {"kv_connector": "MoRIIOConnector", "kv_rank": 0}
    assert accepted_by(release("0.31.0"), config) == config
    with pytest.raises(ValueError, match=r"0\.32's KVTransferConfig has no field kv_rank"):
        accepted_by(release("0.32.0"), config)


def test_the_launcher_checks_the_declared_release_or_the_pin() -> None:
    for version, expected in ((None, PINNED_VLLM_VERSION), ("0.34.0", "0.34.0")):
        spec = spec_in("qwen3-235b-write.yaml", version)
        for eng in engine_containers(spec):
            launcher = engine_command(spec, eng)
            launcher = launcher[: launcher.index("--")]
            assert launcher[launcher.index("--vllm-version") + 1] == expected


def test_a_simulated_engine_reproduces_the_declared_release_unless_its_env_says_otherwise() -> None:
    spec = spec_in("simulated-write.yaml", "0.33.0")
    eng = engine_containers(spec)[0]
    env = {e["name"]: e.get("value") for e in engine_env(spec, eng, "creds")}
    assert env[SIM_VLLM_VERSION_ENV] == "0.33.0"
    prefill = load_example("simulated-write.yaml")["spec"]["prefill"]
    image_of_another = prefill | {"env": [{"name": SIM_VLLM_VERSION_ENV, "value": "0.32.0"}]}
    spec = spec_in("simulated-write.yaml", "0.33.0", prefill=image_of_another)
    eng = next(e for e in engine_containers(spec) if e.role == "prefill")
    entries = [e for e in engine_env(spec, eng, "creds") if e["name"] == SIM_VLLM_VERSION_ENV]
    assert entries == [{"name": SIM_VLLM_VERSION_ENV, "value": "0.32.0"}]


def test_real_engines_get_no_simulator_setting() -> None:
    spec = spec_in("qwen3-235b-write.yaml", "0.33.0")
    names = {e["name"] for eng in engine_containers(spec) for e in engine_env(spec, eng, "creds")}
    assert SIM_VLLM_VERSION_ENV not in names
