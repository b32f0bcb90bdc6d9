"""The settings file: which keys reload, how values are checked, and the relations a reload may not break."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from pd_runtime.proxy import reload
from pd_runtime.proxy.cli import build_parser
from pd_runtime.proxy.config import ProxyConfig, Timeouts
from pd_runtime.proxy.reload import Refusal, ReloadState, SettingsError

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BASE = ProxyConfig(kv_wait_limit_s=95.0, timeouts=Timeouts(kv_wait=95.0))


def _file(values: dict[str, Any]) -> bytes:
    return json.dumps(values).encode()


def test_reloadable_keys_are_the_routing_and_timeout_flags() -> None:
    assert set(reload.SETTINGS) == {
        "policy", "max-tokens-policy", "no-kv-fallback", "on-kv-mismatch",
        "connect-timeout", "prefill-timeout", "first-byte-timeout", "kv-wait-timeout",
        "idle-timeout", "response-timeout", "health-timeout", "max-in-flight", "max-queued", "queue-timeout",
        "affinity-prefix-tokens", "affinity-max-imbalance", "disaggregation", "disaggregation-threshold",
    }  # fmt: skip
    flags = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert {f"--{key}" for key in reload.SETTINGS} <= flags  # the file speaks the flags' names
    assert {f"--{key}" for key in reload.RESTART_ONLY} <= flags
    assert "port" in reload.RESTART_ONLY and "kv-wait-limit" in reload.RESTART_ONLY


def test_a_file_overrides_the_flags_and_a_removed_key_restores_the_flag_value() -> None:
    started = ProxyConfig(policy="round_robin", timeouts=Timeouts(idle=60.0))
    changed = reload.evaluate(started, _file({"policy": "least_outstanding", "idle-timeout": 12}))
    assert changed.config is not None
    assert changed.config.policy == "least_outstanding" and changed.config.timeouts.idle == 12.0
    restored = reload.evaluate(started, _file({"policy": "least_outstanding"}))
    assert restored.config is not None and restored.config.timeouts.idle == 60.0  # the flag's value again
    assert reload.evaluate(started, b"{}").config == started


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "expected a JSON object"),
        (_file({"policy": "random"}), "policy: 'random' is not one of round_robin, least_outstanding, least_load"),
        (_file({"idle-timeout": 0}), "idle-timeout: must be > 0"),
        (_file({"idle-timeout": "5"}), 'idle-timeout: expected a number, got "5"'),
        (_file({"idle-timeout": True}), "idle-timeout: expected a number, got true"),
        (_file({"port": 9000}), "port: takes effect only at start"),
        (_file({"kv-wait-limit": 500}), "kv-wait-limit: takes effect only at start"),
        (_file({"polcy": "round_robin"}), "polcy: unknown setting; reloadable are affinity-max-imbalance, "),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(content: bytes, message: str) -> None:
    with pytest.raises(SettingsError, match="^" + message.replace("(", r"\(")):
        reload.parse_settings(content)
    assert reload.evaluate(BASE, content) == reload.Outcome(None, str(_error(content)))


def _error(content: bytes) -> SettingsError:
    try:
        reload.parse_settings(content)
    except SettingsError as exc:
        return exc
    raise AssertionError("expected a refusal")


def test_a_kv_wait_above_the_engines_limit_is_refused() -> None:
    refused = reload.evaluate(BASE, _file({"kv-wait-timeout": 200, "policy": "least_outstanding"}))
    assert refused.config is None
    assert refused.reason.startswith("kv-wait-timeout 200 is above the engines' limit 95 (--kv-wait-limit")
    at_limit = reload.evaluate(BASE, _file({"kv-wait-timeout": 95}))
    assert at_limit.config is not None and at_limit.config.timeouts.kv_wait == 95.0
    lower = reload.evaluate(BASE, _file({"kv-wait-timeout": 20}))
    assert lower.config is not None and lower.config.timeouts.kv_wait == 20.0
    unbounded = reload.evaluate(ProxyConfig(), _file({"kv-wait-timeout": 5000}))  # no --kv-wait-limit
    assert unbounded.config is not None


def test_status_shows_what_runs_and_what_was_refused() -> None:
    state = ReloadState(file="/etc/pd-proxy/proxy.json")
    assert state.to_json(BASE)["digest"] is None and state.to_json(BASE)["refused"] is None
    state = state.applied_content("aaaa", AT).refused_content(Refusal("bbbb", AT, "kv-wait-timeout 200 is above"))
    doc = state.to_json(BASE)
    assert doc["file"] == "/etc/pd-proxy/proxy.json" and doc["digest"] == "aaaa"
    assert doc["applied_at"] == "2026-12-01T12:00:00.000Z"
    refused = {"digest": "bbbb", "at": "2026-12-01T12:00:00.000Z", "reason": "kv-wait-timeout 200 is above"}
    assert doc["refused"] == refused
    assert doc["reloads"] == {"applied": 1, "refused": 1}
    assert set(doc["settings"]) == set(reload.SETTINGS)
    assert doc["settings"]["kv-wait-timeout"] == 95.0 and doc["settings"]["policy"] == "round_robin"
    assert state.applied_content("cccc", AT).refused is None  # a later good file clears the refusal
