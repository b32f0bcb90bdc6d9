"""The agent's kubelet-style volume writer: ..data swaps, top-level links, and the periodic refresh."""

from __future__ import annotations

import os
from pathlib import Path

from e2e.configmaps import DATA_LINK, VolumeRefresher, current_payload, write_atomic
from e2e.podspec import PodFacts, Refs, VolumeFile, plan_volumes

FACTS = PodFacts(pod_ip="10.0.0.2", host_ip="10.0.0.1")


def test_the_layout_is_the_kubelets_and_a_swap_replaces_everything_at_once(tmp_path: Path) -> None:
    volume = tmp_path / "settings"
    assert write_atomic(volume, [VolumeFile("proxy.json", "{}", 0o644), VolumeFile("a/b.txt", "x", 0o600)])
    first = os.readlink(volume / DATA_LINK)
    assert first.startswith("..") and (volume / first / "proxy.json").is_file()
    assert os.readlink(volume / "proxy.json") == f"{DATA_LINK}/proxy.json" and os.readlink(volume / "a") == "..data/a"
    assert current_payload(volume) == {"proxy.json": ("{}", 0o644), "a/b.txt": ("x", 0o600)}

    assert not write_atomic(volume, [VolumeFile("proxy.json", "{}", 0o644), VolumeFile("a/b.txt", "x", 0o600)])
    assert os.readlink(volume / DATA_LINK) == first  # nothing touched when nothing changed

    assert write_atomic(volume, [VolumeFile("proxy.json", '{"policy": "least_outstanding"}', 0o644)])
    assert (volume / "proxy.json").read_text() == '{"policy": "least_outstanding"}'
    assert not (volume / "a").exists() and not (volume / "a").is_symlink()  # removed key, removed link
    assert not (volume / first).exists()  # the old timestamped directory is gone
    entries = sorted(p.name for p in volume.iterdir())
    assert entries == sorted([DATA_LINK, os.readlink(volume / DATA_LINK), "proxy.json"])


async def test_the_refresher_rewrites_the_volumes_whose_objects_changed(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [{"name": "c"}],
            "volumes": [
                {"name": "settings", "configMap": {"name": "cm"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    refs: dict[tuple[str, str, str], dict[str, str] | None] = {("ConfigMap", "ns", "cm"): {"proxy.json": "1"}}
    volumes = {"settings": tmp_path / "settings", "scratch": tmp_path / "scratch"}
    write_atomic(volumes["settings"], [VolumeFile("proxy.json", "1", 0o644)])

    async def fetch() -> Refs:
        return refs

    refresher = VolumeRefresher(fetch, lambda r: plan_volumes(pod, r, FACTS), volumes)
    assert await refresher.sync_once() == []
    refs[("ConfigMap", "ns", "cm")] = {"proxy.json": "2"}
    assert await refresher.sync_once() == ["settings"]
    assert (volumes["settings"] / "proxy.json").read_text() == "2"
    assert not volumes["scratch"].exists()  # emptyDirs are never touched
