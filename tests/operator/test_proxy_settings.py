"""The proxy's settings derived from the engines' (pure): the wait for KV and the decode in-flight limit."""

from __future__ import annotations

import pytest

from pd_operator.engine_cmd import proxy_command
from pd_operator.validation import SpecError, validate_spec
from tests.operator.conftest import load_example


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_kv_wait_follows_the_engines_defer_and_transfer_timeouts() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["kvTransfer"] = {**spec.get("kvTransfer", {}), "deferTimeoutSeconds": 120, "transferTimeoutSeconds": 20}
    cmd = proxy_command(validate_spec(spec))
    assert _flag(cmd, "--kv-wait-timeout") == "145"


def test_simulated_engines_count_their_timeouts_in_scaled_time() -> None:
    spec = load_example("simulated-write.yaml")["spec"]
    spec["simulation"] = {**spec.get("simulation", {}), "timeScale": 10}
    assert _flag(proxy_command(validate_spec(spec)), "--kv-wait-timeout") == "14"  # 90 / 10 + 5 s of wall time


def test_an_explicit_kv_wait_within_the_limit_is_kept_and_one_above_is_refused() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["proxy"] = {**spec.get("proxy", {}), "timeouts": {"kvWaitSeconds": 45}}
    assert _flag(proxy_command(validate_spec(spec)), "--kv-wait-timeout") == "45"
    spec["proxy"]["timeouts"]["kvWaitSeconds"] = 96
    with pytest.raises(SpecError, match=r"kvTransfer\.deferTimeoutSeconds"):
        validate_spec(spec)


def test_decode_in_flight_limit_is_decodes_max_num_seqs_or_vllms_default() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["decode"] = {**spec["decode"], "maxNumSeqs": 32}
    assert _flag(proxy_command(validate_spec(spec)), "--decode-max-in-flight") == "32"
    spec["decode"].pop("maxNumSeqs")
    assert _flag(proxy_command(validate_spec(spec)), "--decode-max-in-flight") == "1024"


def test_no_kv_fallback_is_passed_through() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    spec["proxy"] = {**spec.get("proxy", {}), "noKvFallback": "error"}
    assert _flag(proxy_command(validate_spec(spec)), "--no-kv-fallback") == "error"
