"""The vLLM version knob: which connector behaviour each release has (read in vLLM's wheels)."""

from __future__ import annotations

import pytest

from pd_runtime.sim.config import ConfigError, parse_args
from pd_runtime.sim.engine import SimEngine
from pd_runtime.sim.profiles import INSTANT
from pd_runtime.sim.versions import MORIIO_METRICS_FLAG, ConnectorBehaviour, decode_alone_refusal
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import RELEASES, format_version, parse_version


@pytest.mark.parametrize(
    ("version", "read", "waits", "skips", "stalls"),
    [
        ("0.29.0", False, True, False, True),
        ("0.29.0", True, False, True, False),
        ("0.31.1", False, True, False, True),
        ("0.32.0", False, False, False, False),
        ("0.32.0", True, False, True, False),
        ("0.33.0", True, False, False, False),
    ],
)
def test_behaviours_by_version(version: str, read: bool, waits: bool, skips: bool, stalls: bool) -> None:
    behaviour = ConnectorBehaviour.of(version, read)
    assert behaviour.plain_decode_waits_for_kv is waits
    assert behaviour.plain_decode_skips_prefill is skips
    assert behaviour.preempted_remote_stalls is stalls


@pytest.mark.parametrize("line", [r.line for r in RELEASES])
def test_no_release_exports_vllm_mains_moriio_metrics_unless_asked(line: tuple[int, int]) -> None:
    argv = ["m", "--vllm-version", format_version((*line, 0)), "-dp", "2"]
    released = SimEngine(parse_args(argv, env={}), INSTANT).metrics.render().decode()
    asked = SimEngine(parse_args([*argv, MORIIO_METRICS_FLAG], env={}), INSTANT).metrics.render().decode()
    assert "vllm:moriio_" not in released
    assert 'vllm:moriio_num_failed_transfers_total{engine="1",model_name="m"} 0.0' in asked


def test_the_default_is_the_image_pin_and_the_flag_or_env_override_it() -> None:
    assert parse_args(["m"], env={}).vllm_version == PINNED_VLLM_VERSION
    assert parse_args(["m", "--vllm-version", "0.33.0"], env={}).vllm_version == "0.33.0"
    assert parse_args(["m"], env={"PD_SIM_VLLM_VERSION": "0.32.0"}).vllm_version == "0.32.0"
    for unknown in ("new", "0.20.0"):
        with pytest.raises(ConfigError, match="vllm-version"):
            parse_args(["m", "--vllm-version", unknown], env={})


@pytest.mark.parametrize(
    ("version", "read", "refused"),
    [("0.31.0", False, True), ("0.31.0", True, True), ("0.32.0", False, False), ("0.32.0", True, True),
     ("0.33.0", False, False), ("0.33.0", True, False)],
)  # fmt: skip
def test_decode_alone_is_refused_where_decode_does_not_compute_a_plain_request(
    version: str, read: bool, refused: bool
) -> None:
    refusal = decode_alone_refusal(version, read)
    assert (refusal is not None) is refused
    assert refusal is None or f"vLLM {version}" in refusal


@pytest.mark.parametrize(
    ("name", "read", "first"),
    [
        ("write_failed_notice", False, "0.33.0"),
        ("mixed_tp_write", False, "0.33.0"),
        ("unallocated_read_releases", True, "0.31.0"),
    ],
)
def test_the_033_behaviours_start_at_their_release(name: str, read: bool, first: str) -> None:
    for version in ("0.29.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"):
        expected = parse_version(version) >= parse_version(first)
        assert getattr(ConnectorBehaviour.of(version, read), name) is expected, version
    other_mode = getattr(ConnectorBehaviour.of("0.34.0", not read), name)
    assert other_mode is (name == "mixed_tp_write")  # a release property, not a mode's
