"""The proxy's settings (pure): the wait for KV and the decode in-flight limit derived from the engines',
the reloadable ones in the settings file, and which changes roll the pod."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_operator import layout, render
from pd_operator.command_lines import proxy_command, proxy_settings
from pd_operator.validation import SpecError, validate_spec
from pd_runtime.proxy import reload
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from tests.operator.conftest import EXAMPLES, load_example


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_kv_wait_follows_the_engines_defer_and_transfer_timeouts() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["kvTransfer"] = {**spec.get("kvTransfer", {}), "deferTimeoutSeconds": 120, "transferTimeoutSeconds": 20}
    cmd = proxy_command(validate_spec(spec))
    assert _flag(cmd, "--kv-wait-timeout") == _flag(cmd, "--kv-wait-limit") == "145"
    assert proxy_settings(validate_spec(spec))["kv-wait-timeout"] == 145


def test_simulated_engines_count_their_timeouts_in_scaled_time() -> None:
    spec = load_example("simulated-write.yaml")["spec"]
    spec["simulation"] = {**spec.get("simulation", {}), "timeScale": 10}
    assert _flag(proxy_command(validate_spec(spec)), "--kv-wait-limit") == "14"  # 90 / 10 + 5 s of wall time


def test_an_explicit_kv_wait_within_the_limit_is_kept_and_one_above_is_refused() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["proxy"] = {**spec.get("proxy", {}), "timeouts": {"kvWaitSeconds": 45}}
    assert proxy_settings(validate_spec(spec))["kv-wait-timeout"] == 45
    assert _flag(proxy_command(validate_spec(spec)), "--kv-wait-limit") == "95"
    spec["proxy"]["timeouts"]["kvWaitSeconds"] = 96
    with pytest.raises(SpecError, match=r"kvTransfer\.deferTimeoutSeconds"):
        validate_spec(spec)


def test_decode_in_flight_limit_is_decodes_max_num_seqs_or_vllms_default() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["decode"] = {**spec["decode"], "maxNumSeqs": 32}
    assert _flag(proxy_command(validate_spec(spec)), "--decode-max-in-flight") == "32"
    spec["decode"].pop("maxNumSeqs")
    assert _flag(proxy_command(validate_spec(spec)), "--decode-max-in-flight") == "1024"


@pytest.mark.parametrize(("grace", "delay", "timeout"), [(300, "5", "294"), (5, "1.25", "2.75"), (0, "0", "0")])
def test_the_drain_delay_and_timeout_share_the_termination_grace_period(grace: int, delay: str, timeout: str) -> None:
    """A deleted replica serves on (not ready) while the Service drops it, then drains in what is left."""
    spec = load_example("simulated-write.yaml")["spec"]
    spec["terminationGracePeriodSeconds"] = grace
    cmd = proxy_command(validate_spec(spec))
    assert (_flag(cmd, "--drain-delay"), _flag(cmd, "--drain-timeout")) == (delay, timeout)


def test_no_kv_fallback_is_passed_through() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["proxy"] = {**spec.get("proxy", {}), "noKvFallback": "error"}
    assert proxy_settings(validate_spec(spec))["no-kv-fallback"] == "error"


def test_on_kv_mismatch_is_passed_through_and_needs_the_canary() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    assert proxy_settings(validate_spec(spec))["on-kv-mismatch"] == "report"
    spec["proxy"] = {**spec.get("proxy", {}), "onKvMismatch": "stopServing"}
    assert proxy_settings(validate_spec(spec))["on-kv-mismatch"] == "stopServing"


def test_threshold_disaggregation_is_refused_naming_the_engines_vllm_version() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["proxy"] = {**spec.get("proxy", {}), "disaggregation": {"policy": "threshold"}}
    refusal = rf"spec\.proxy\.disaggregation\.policy: .*the image's {PINNED_VLLM_VERSION}\) must compute itself"
    with pytest.raises(SpecError, match=refusal):
        validate_spec(spec)
    assert validate_spec({**spec, "proxy": {"disaggregation": {"policy": "always"}}})


@pytest.mark.parametrize(
    ("version", "mode", "refused"),
    [("0.31.0", "write", True), ("0.32.0", "write", False), ("0.32.1", "read", True), ("0.33.0", "read", False),
     ("0.34.0", "write", False)],
)  # fmt: skip
def test_threshold_disaggregation_follows_the_engines_version(version: str, mode: str, refused: bool) -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["engineVersion"] = version
    spec["kvTransfer"] = {**spec["kvTransfer"], "transferMode": mode}
    spec["proxy"] = {**spec.get("proxy", {}), "disaggregation": {"policy": "threshold", "thresholdTokens": 512}}
    if refused:
        with pytest.raises(SpecError, match="serves requests on decode alone"):
            validate_spec(spec)
        return
    settings = proxy_settings(validate_spec(spec))
    assert (settings["disaggregation"], settings["disaggregation-threshold"]) == ("threshold", 512)
    assert reload.evaluate(ProxyConfig(), json.dumps(settings).encode()).config is not None  # the proxy takes it


def test_always_leaves_the_settings_file_as_it_was() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    assert "disaggregation" not in proxy_settings(validate_spec(spec))


def _rendered(spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The pod's spec hash and the proxy's settings file."""
    children = render.children(layout.build(layout.Owner("qwen"), validate_spec(spec)))
    (settings,) = [c for c in children.applied if c["kind"] == "ConfigMap"]
    text = settings["data"]["proxy.json"]
    return children.pod["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH], json.loads(text)


@pytest.mark.parametrize(
    "proxy",
    [
        {"policy": "least_outstanding"},
        {"noKvFallback": "error"},
        {"onKvMismatch": "stopServing"},
        {"timeouts": {"kvWaitSeconds": 30, "idleSeconds": 20, "connectSeconds": 2, "prefillSeconds": 100}},
        {"timeouts": {"decodeFirstByteSeconds": 50, "responseSeconds": 600}},
    ],
)
def test_routing_and_timeouts_change_the_settings_file_not_the_pod(proxy: dict[str, Any]) -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    before_hash, before = _rendered(spec)
    after_hash, after = _rendered({**spec, "proxy": {**spec.get("proxy", {}), **proxy}})
    assert after_hash == before_hash and after != before


def test_what_needs_a_restart_rolls_the_pod() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    before_hash, _ = _rendered(spec)
    for changed in (
        {**spec, "proxy": {**spec.get("proxy", {}), "heartbeatTtlSeconds": 60}},
        {**spec, "kvTransfer": {**spec.get("kvTransfer", {}), "deferTimeoutSeconds": 120}},
    ):
        assert _rendered(changed)[0] != before_hash


def test_the_proxy_accepts_every_rendered_settings_file() -> None:
    """The operator's half of the file format, checked by the proxy's own parser (the contract)."""
    for path in EXAMPLES:
        spec = validate_spec(load_example(path.name)["spec"])
        values = reload.parse_settings(json.dumps(proxy_settings(spec)).encode())
        base = ProxyConfig(kv_wait_limit_s=spec.proxy_kv_wait_limit() if spec.disaggregated else None)
        assert reload.relation_problems(reload.merged(base, values)) == [], path.name
        assert values["policy"] == spec.proxy.policy


def test_the_admission_limit_and_queue_reach_the_settings_file_only_when_set() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    assert "max-in-flight" not in proxy_settings(validate_spec(spec))  # the flag's value (no limit) applies
    admission = {"maxInFlight": 256, "maxQueued": 512, "queueTimeoutSeconds": 10}
    settings = proxy_settings(validate_spec({**spec, "proxy": {**spec.get("proxy", {}), "admission": admission}}))
    assert (settings["max-in-flight"], settings["max-queued"], settings["queue-timeout"]) == (256, 512, 10)
    values = reload.parse_settings(json.dumps(settings).encode())  # the proxy takes them
    config = reload.merged(ProxyConfig(), values)
    assert (config.max_in_flight, config.max_queued, config.queue_timeout_s) == (256, 512, 10.0)
    assert "--max-in-flight" not in proxy_command(validate_spec(spec))  # reloaded, never a restart


def test_prefix_affinity_settings_reach_the_settings_file_with_the_policy() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    assert "affinity-prefix-tokens" not in proxy_settings(validate_spec(spec))
    proxy = {**spec.get("proxy", {}), "policy": "prefix_affinity", "prefixAffinity": {"prefixTokens": 256}}
    settings = proxy_settings(validate_spec({**spec, "proxy": proxy}))
    assert (settings["policy"], settings["affinity-prefix-tokens"], settings["affinity-max-imbalance"]) == (
        "prefix_affinity",
        256,
        4,
    )
    config = reload.merged(ProxyConfig(), reload.parse_settings(json.dumps(settings).encode()))
    assert (config.policy, config.affinity_prefix_tokens, config.affinity_max_imbalance) == ("prefix_affinity", 256, 4)
