"""The engines' compile and JIT caches: one volume, a directory per engine, the variables that point there."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator import layout, render
from pd_operator.validation import SpecError, validate_spec
from tests.operator.conftest import load_example

CACHE_VARS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "MORI_JIT_CACHE_DIR", "AITER_JIT_DIR")


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    return render.pod(layout.build(layout.Owner("qwen"), validate_spec(spec)))


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_each_engine_caches_in_its_own_directory_of_an_emptydir() -> None:
    pod = _pod(load_example("qwen3-235b-write.yaml")["spec"])
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "pd-engine-cache"]
    assert volume == {"name": "pd-engine-cache", "emptyDir": {"sizeLimit": "32Gi"}}  # survives container restarts
    engines = [c for c in pod["spec"]["containers"] if c["name"] != "proxy"]
    roots = set()
    for c in engines:
        assert {"name": "pd-engine-cache", "mountPath": "/var/cache/pd"} in c["volumeMounts"]
        env = _env(c)
        assert env["VLLM_CACHE_ROOT"] == f"/var/cache/pd/{c['name']}/vllm"
        assert env["TRITON_CACHE_DIR"] == f"/var/cache/pd/{c['name']}/triton"
        assert env["AITER_JIT_DIR"].startswith(f"/var/cache/pd/{c['name']}/aiter-")
        roots |= {env[name] for name in CACHE_VARS}
    assert len(roots) == len(CACHE_VARS) * len(engines)  # no two engines share a directory
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "proxy")
    assert not set(CACHE_VARS) & set(_env(proxy))


def test_aiters_directory_follows_the_image() -> None:
    spec = load_example("qwen3-235b-write.yaml")["spec"]
    before = _env(_pod(spec)["spec"]["containers"][0])
    after = _env(_pod({**spec, "image": spec["image"] + "-next"})["spec"]["containers"][0])
    assert before["AITER_JIT_DIR"] != after["AITER_JIT_DIR"]  # modules built against another image are not reused
    assert before["VLLM_CACHE_ROOT"] == after["VLLM_CACHE_ROOT"]  # vLLM and Triton key their caches by version


@pytest.mark.parametrize(
    ("storage", "volume"),
    [
        (
            {"persistentVolumeClaim": "compile-cache"},
            {"persistentVolumeClaim": {"claimName": "compile-cache", "readOnly": False}},
        ),
        ({"hostPath": "/var/lib/pd-cache"}, {"hostPath": {"path": "/var/lib/pd-cache", "type": "DirectoryOrCreate"}}),
        ({"sizeLimit": "100Gi", "mountPath": "/cache"}, {"emptyDir": {"sizeLimit": "100Gi"}}),
    ],
)
def test_a_named_claim_or_node_directory_keeps_the_caches_beyond_the_pod(
    storage: dict[str, Any], volume: dict[str, Any]
) -> None:
    spec = {**load_example("qwen3-235b-write.yaml")["spec"], "cacheStorage": storage}
    pod = _pod(spec)
    assert {"name": "pd-engine-cache", **volume} in pod["spec"]["volumes"]
    mount_path = storage.get("mountPath", "/var/cache/pd")
    assert _env(pod["spec"]["containers"][0])["VLLM_CACHE_ROOT"] == f"{mount_path}/prefill/vllm"


def test_a_claim_and_a_node_directory_together_are_refused() -> None:
    spec = {
        **load_example("qwen3-235b-write.yaml")["spec"],
        "cacheStorage": {"persistentVolumeClaim": "c", "hostPath": "/x"},
    }
    with pytest.raises(SpecError, match="cacheStorage: set at most one of persistentVolumeClaim and hostPath"):
        validate_spec(spec)
