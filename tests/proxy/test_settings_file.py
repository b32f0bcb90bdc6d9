"""The running proxy follows its settings file as the kubelet updates it (atomic ..data swaps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from pd_runtime.proxy.config import Timeouts
from pd_runtime.proxy.metrics import ProxyMetrics
from pd_runtime.proxy.registry import Registry
from pd_runtime.proxy.watcher import SettingsWatcher
from tests.proxy.conftest import SetupFactory
from tests.proxy.kubelet_volume import publish
from tests.proxy.proxy_fakes import proxy_config, wait_for


def _publish(volume: Path, values: dict[str, Any]) -> Path:
    return publish(volume, "proxy.json", json.dumps(values))


def _watcher(path: Path, **overrides: Any) -> SettingsWatcher:
    config = proxy_config(config_file=str(path), **overrides)
    return SettingsWatcher(config, ProxyMetrics(Registry("disaggregated", "auto", None, [])))


def test_start_takes_the_file_or_falls_back_to_the_flags(tmp_path: Path) -> None:
    path = _publish(tmp_path / "a", {"policy": "least_outstanding"})
    assert _watcher(path).initial().policy == "least_outstanding"

    path = _publish(tmp_path / "b", {"kv-wait-timeout": 300})
    watcher = _watcher(path, kv_wait_limit_s=95.0, timeouts=Timeouts(kv_wait=95.0))
    assert watcher.initial() == watcher.base  # refused: the flags apply
    assert watcher.state.refused is not None and "above the engines' limit 95" in watcher.state.refused.reason
    assert watcher.metrics.config_refused._value.get() == 1

    missing = _watcher(tmp_path / "nowhere.json")
    assert missing.initial() == missing.base
    assert missing.state.refused is not None and missing.state.refused.reason.startswith("cannot read")


def test_a_swapped_content_is_evaluated_once(tmp_path: Path) -> None:
    volume = tmp_path / "proxy-config"
    watcher = _watcher(_publish(volume, {"policy": "round_robin"}))
    watcher.initial()
    assert watcher.check() is None  # unchanged content: nothing to do
    _publish(volume, {"policy": "least_outstanding"})
    applied = watcher.check()
    assert applied is not None and applied.policy == "least_outstanding"
    _publish(volume, {"policy": "nope"})
    assert watcher.check() is None and watcher.check() is None
    assert (watcher.state.applied, watcher.state.refusals) == (2, 1)  # the refused content counted once


async def _status(client: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with client.get(url + "/status") as resp:
        doc: dict[str, Any] = json.loads(await resp.read())
        return doc


async def test_a_changed_policy_takes_effect_and_an_unsafe_wait_is_refused(
    pd_setup: SetupFactory, tmp_path: Path
) -> None:
    volume = tmp_path / "proxy-config"
    path = _publish(volume, {"policy": "round_robin", "kv-wait-timeout": 95})
    setup = await pd_setup(
        config_file=str(path), config_poll_interval_s=0.05, kv_wait_limit_s=95.0, timeouts=Timeouts(kv_wait=95.0)
    )
    doc = (await _status(setup.client, setup.admin_url))["config"]
    assert doc["file"] == str(path) and doc["settings"]["policy"] == "round_robin" and doc["refused"] is None

    admission = {"max-in-flight": 4, "max-queued": 8, "queue-timeout": 5}
    _publish(volume, {"policy": "least_outstanding", "kv-wait-timeout": 40, **admission})
    await wait_for(lambda: setup.proxy.core.router.policy == "least_outstanding", what="policy reloaded")
    assert setup.proxy.core.config.timeouts.kv_wait == 40.0
    gate = setup.proxy.admission
    assert (gate.state.limit, gate.state.max_queued, gate.timeout_s) == (4, 8, 5.0)  # the admission queue too
    assert (await setup.post("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2}))[0] == 200
    doc = (await _status(setup.client, setup.admin_url))["config"]
    assert doc["settings"]["policy"] == "least_outstanding" and doc["reloads"] == {"applied": 2, "refused": 0}

    _publish(volume, {"policy": "round_robin", "kv-wait-timeout": 300})
    await wait_for(lambda: setup.proxy.watcher is not None and setup.proxy.watcher.state.refused is not None)
    assert setup.proxy.core.router.policy == "least_outstanding"  # the whole file was refused
    doc = (await _status(setup.client, setup.admin_url))["config"]
    assert doc["refused"]["reason"].startswith("kv-wait-timeout 300 is above the engines' limit 95")
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        metrics = await resp.text()
    assert "pd_proxy_config_refused 1.0" in metrics
    assert 'pd_proxy_config_reloads_total{result="refused"} 1.0' in metrics
