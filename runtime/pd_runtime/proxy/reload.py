"""Pure: the settings file (the operator's ConfigMap) -> the proxy's next settings, or why not.

Routing and timeouts change without restarting anything: the operator renders them into a ConfigMap
mounted in the proxy container, and the proxy re-reads the file when its content changes (watcher.py).
Only fields declared ``reload=True`` in config.py may appear; each key is the field's flag name without
the dashes (``policy``, ``kv-wait-timeout``), its value what the flag would take. Keys the file lacks
keep the values the proxy was started with, so removing a key restores the flag's value.

A reload that would break a relation the engines depend on is refused and the running settings stay:
the engines' ``defer_timeout`` and ``transfer_timeout`` are baked into their command lines, so a KV
wait above ``--kv-wait-limit`` (their sum plus the margin) would have the proxy wait for KV prefill has
already dropped. Such a file shows up while the engines still run with the old timeouts (the operator
renders the new ConfigMap before the rolled pod is up) or after a hand edit of the ConfigMap.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import typing
from collections.abc import Mapping
from dataclasses import Field, dataclass, replace
from datetime import datetime
from typing import Any

from pd_runtime.proxy.config import TIMEOUT_SUFFIX, ProxyConfig, Timeouts, flag_fields, flag_name
from pd_runtime.proxy.status import rfc3339


@dataclass(frozen=True)
class Setting:
    """One reloadable field: its key in the file and where it lives in a ProxyConfig."""

    key: str
    field: Field[Any]
    in_timeouts: bool
    choices: tuple[str, ...] | None  # a Literal field's values; None for numbers


def _settings() -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for cls, suffix in ((ProxyConfig, ""), (Timeouts, TIMEOUT_SUFFIX)):
        hints = typing.get_type_hints(cls)
        for item in flag_fields(cls):
            if item.metadata["reload"]:
                hint = hints[item.name]
                choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
                key = flag_name(item, suffix).removeprefix("--")
                found[key] = Setting(key, item, cls is Timeouts, choices)
    return found


SETTINGS: Mapping[str, Setting] = _settings()
RESTART_ONLY = frozenset(
    flag_name(item, suffix).removeprefix("--")
    for cls, suffix in ((ProxyConfig, ""), (Timeouts, TIMEOUT_SUFFIX))
    for item in flag_fields(cls)
    if not item.metadata["reload"]
)


class SettingsError(ValueError):
    """The file cannot be applied; the message names the key at fault."""


def _value(setting: Setting, raw: Any) -> Any:
    if setting.choices is not None:
        if raw not in setting.choices:
            raise SettingsError(f"{setting.key}: {raw!r} is not one of {', '.join(setting.choices)}")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SettingsError(f"{setting.key}: expected a number, got {json.dumps(raw)}")
    try:
        return setting.field.metadata["parse"](str(raw))
    except argparse.ArgumentTypeError as exc:
        raise SettingsError(f"{setting.key}: {exc}") from None


def parse_settings(content: bytes) -> dict[str, Any]:
    """The file's settings by key, each checked as its flag would be."""
    try:
        document = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SettingsError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SettingsError("expected a JSON object of settings")
    values: dict[str, Any] = {}
    for key, raw in document.items():
        setting = SETTINGS.get(key)
        if setting is None:
            if key in RESTART_ONLY:
                raise SettingsError(f"{key}: takes effect only at start (a flag); it cannot be reloaded")
            raise SettingsError(f"{key}: unknown setting; reloadable are {', '.join(sorted(SETTINGS))}")
        values[key] = _value(setting, raw)
    return values


def merged(base: ProxyConfig, values: Mapping[str, Any]) -> ProxyConfig:
    """``base`` (the flags) with the file's values; keys the file lacks keep their flag values."""
    top = {SETTINGS[k].field.name: v for k, v in values.items() if not SETTINGS[k].in_timeouts}
    timeouts = {SETTINGS[k].field.name: v for k, v in values.items() if SETTINGS[k].in_timeouts}
    return replace(base, **top, timeouts=replace(base.timeouts, **timeouts))


def relation_problems(config: ProxyConfig) -> list[str]:
    """What in ``config`` breaks what the running engines rely on."""
    limit, wait = config.kv_wait_limit_s, config.timeouts.kv_wait
    if limit is not None and wait > limit:
        return [
            f"kv-wait-timeout {wait:g} is above the engines' limit {limit:g} (--kv-wait-limit: their defer_timeout "
            "+ transfer_timeout + margin, fixed in their command lines): prefill drops the KV before that; a longer "
            "wait needs longer engine timeouts first, which restarts the engines"
        ]
    return []


def current_values(config: ProxyConfig) -> dict[str, Any]:
    """Every reloadable setting's value in effect, by key (for /status)."""
    return {
        key: getattr(config.timeouts if s.in_timeouts else config, s.field.name) for key, s in sorted(SETTINGS.items())
    }


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:16]


@dataclass(frozen=True)
class Outcome:
    """The settings to run with after reading the file, or (``config`` None) why the file was refused."""

    config: ProxyConfig | None
    reason: str = ""


def evaluate(base: ProxyConfig, content: bytes) -> Outcome:
    try:
        candidate = merged(base, parse_settings(content))
    except SettingsError as exc:
        return Outcome(None, str(exc))
    problems = relation_problems(candidate)
    return Outcome(None, "; ".join(problems)) if problems else Outcome(candidate)


@dataclass(frozen=True)
class Refusal:
    digest: str
    at: datetime
    reason: str


@dataclass(frozen=True)
class ReloadState:
    """What /status says about the settings file: what runs, and the last refused content."""

    file: str | None
    digest: str | None = None  # of the applied content; None: only the flags apply
    applied_at: datetime | None = None
    refused: Refusal | None = None  # set while the file's current content is refused
    applied: int = 0
    refusals: int = 0

    def applied_content(self, content_digest: str, at: datetime) -> ReloadState:
        return replace(self, digest=content_digest, applied_at=at, refused=None, applied=self.applied + 1)

    def refused_content(self, refusal: Refusal) -> ReloadState:
        return replace(self, refused=refusal, refusals=self.refusals + 1)

    def to_json(self, config: ProxyConfig) -> dict[str, Any]:
        refused = self.refused
        return {
            "file": self.file,
            "digest": self.digest,
            "applied_at": None if self.applied_at is None else rfc3339(self.applied_at),
            "settings": current_values(config),
            "refused": None
            if refused is None
            else {"digest": refused.digest, "at": rfc3339(refused.at), "reason": refused.reason},
            "reloads": {"applied": self.applied, "refused": self.refusals},
        }
