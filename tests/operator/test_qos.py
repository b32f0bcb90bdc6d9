"""qos.py: every container of the serving pod requests CPU and memory; Guaranteed makes limits = requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator import layout, qos, quantity, render
from pd_operator.commands import render as render_command
from pd_operator.validation import SpecError, validate_spec
from tests.operator.conftest import EXAMPLES, load_example, render_argv


def rendered_pod(example: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> dict[str, Any]:
    """The pod exactly as `pdctl render` prints it."""
    assert render_command.main(render_argv(example, tmp_path)) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    pod: dict[str, Any] = next(d for d in docs if d["kind"] == "Pod")
    return pod


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_a_burstable_pod_with_memory_covering_shm(
    example: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pod = rendered_pod(example, capsys, tmp_path)
    shm = {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["spec"]["volumes"] if v["name"].startswith("dshm-")}
    for container in pod["spec"]["containers"]:
        requests = container["resources"]["requests"]
        assert {"cpu", "memory"} <= requests.keys(), container["name"]
        if container["name"] == render.PROXY_CONTAINER:
            assert {"cpu", "memory"} <= container["resources"]["limits"].keys()
            continue
        assert quantity.parse(requests["memory"]) >= quantity.parse(shm[f"dshm-{container['name']}"])


def test_real_engines_default_to_the_documented_mi300x_values() -> None:
    """Four CPUs and /dev/shm + 16Gi per GPU: a TP4 engine with the default 32Gi /dev/shm asks 16 CPUs, 96Gi."""
    pod = render.pod(lay_of(load_example("qwen3-235b-write.yaml")["spec"]))
    prefill = pod["spec"]["containers"][0]
    assert prefill["resources"]["requests"] == {"cpu": "16", "memory": "96Gi"}
    assert set(prefill["resources"]["limits"]) == {"amd.com/gpu", "rdma/hca_shared_devices_a"}
    proxy = pod["spec"]["containers"][-1]["resources"]
    assert proxy == {"requests": qos.PROXY_REQUESTS, "limits": qos.PROXY_LIMITS}


def test_user_resources_win_key_by_key_and_defaults_never_exceed_a_limit() -> None:
    spec = {
        "model": "m",
        "prefill": {"resources": {"requests": {"cpu": "48"}}, "shmSize": "64Gi"},
        "decode": {"resources": {"limits": {"cpu": "8", "memory": "512Gi"}}},
        "proxy": {"resources": {"requests": {"memory": "2Gi"}}},
        "kvTransfer": {"rdma": {"resourceName": "rdma/x"}},
    }
    containers = {c["name"]: c["resources"] for c in render.pod(lay_of(spec))["spec"]["containers"]}
    assert containers["prefill"]["requests"] == {"cpu": "48", "memory": "128Gi"}
    assert containers["decode"]["requests"] == {"cpu": "8", "memory": "96Gi"}
    assert containers["decode"]["limits"]["memory"] == "512Gi"
    assert containers["proxy"]["requests"]["memory"] == "2Gi" and containers["proxy"]["limits"]["memory"] == "2Gi"


def test_guaranteed_sets_every_limit_to_its_request() -> None:
    spec = {"model": "m", "qosClass": "Guaranteed", "kvTransfer": {"rdma": {"resourceName": "rdma/x"}}}
    for container in render.pod(lay_of(spec))["spec"]["containers"]:
        res = container["resources"]
        assert {k: res["limits"][k] for k in ("cpu", "memory")} == res["requests"], container["name"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"qosClass": "Guaranteed", "proxy": {"resources": {"limits": {"memory": "1Gi"}}}},
            "spec.qosClass: qosClass Guaranteed sets the CPU and memory limits to the requests",
        ),
    ],
)
def test_refused_resources(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({"model": "m", "engine": "simulated", **spec})
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def lay_of(spec: dict[str, Any]) -> layout.Layout:
    return layout.build(layout.Owner("qwen", "ns"), validate_spec(spec))
