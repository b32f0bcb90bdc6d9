"""The table of vLLM release lines: lookups, the supported range, and the facts read in the wheels."""

from __future__ import annotations

import pytest

from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import SUPPORTED, SUPPORTED_RANGE, is_supported, parse_version, release, same_release


def test_versions_parse_like_release_tags_and_local_builds() -> None:
    assert parse_version("v0.32.0rc1") == (0, 32, 0) and parse_version("0.33") == (0, 33, 0)
    assert parse_version("0.31.0+rocm723") == (0, 31, 0)
    with pytest.raises(ValueError):
        parse_version("latest")


def test_a_patch_release_or_an_unread_line_takes_the_row_of_its_line_or_the_one_before() -> None:
    assert release("0.33.2").name == "0.33"
    assert release((0, 30, 0)).name == "0.29"
    with pytest.raises(ValueError, match=r"before 0\.29"):
        release("0.20.0")


def test_the_supported_range_is_0_31_to_0_34_and_holds_the_pin() -> None:
    assert [r.name for r in SUPPORTED] == ["0.31", "0.32", "0.33", "0.34"]
    assert SUPPORTED_RANGE == "0.31 - 0.34"
    assert is_supported(PINNED_VLLM_VERSION)
    assert is_supported("0.34.1") and not is_supported("0.29.0") and not is_supported("0.35.0")
    assert not is_supported("latest")


def test_0_32_removed_the_old_kv_transfer_config_fields_and_every_line_keeps_the_ones_we_render() -> None:
    removed = {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"}
    assert removed <= release("0.31.0").kv_transfer_config_fields
    for version in ("0.32.0", "0.33.0", "0.34.0"):
        fields = release(version).kv_transfer_config_fields
        assert not removed & fields
        assert {"kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy"} <= fields


def test_connector_changes_by_line() -> None:
    r31, r32, r33 = release("0.31.0"), release("0.32.0"), release("0.33.0")
    assert (r31.plain_decode_guard_write, r32.plain_decode_guard_write) == (False, True)
    assert (r32.plain_decode_guard_read, r33.plain_decode_guard_read) == (False, True)
    assert (r32.write_failed, r33.write_failed) == (False, True)
    assert (r32.heterogeneous_tp_write, r33.heterogeneous_tp_write) == (False, True)
    assert release("0.34.0").write_failed and release("0.34.0").heterogeneous_tp_write
    assert (r31.streams_error_before_first_token, r32.streams_error_before_first_token) == (False, True)
    assert (r31.prompt_limit_is_the_context, r32.prompt_limit_is_the_context) == (False, True)


def test_the_same_release_ignores_local_labels_but_not_the_patch() -> None:
    assert same_release("0.31.0", "0.31.0+rocm723") and same_release("0.32.0", "0.32.0+cpu")
    assert not same_release("0.33.0", "0.33.1") and not same_release("0.33.0", "0.31.0")
