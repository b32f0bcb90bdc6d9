"""xPyD in one pod: a container per engine instance, disjoint GPUs and ports, status per instance."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_operator import layout, observe, render
from pd_operator.api import PDDeploymentSpec
from pd_operator.command_lines import engine_containers
from pd_operator.observe import Observation, ReplicaObservation
from pd_operator.validation import SpecError, validate_spec
from pd_operator.views import pod_view
from tests.operator.conftest import DRA, load_example
from tests.operator.podfacts import container_status, running_pod

OWNER = layout.Owner(name="xpyd", namespace="ns1", uid="uid-1", generation=1)
NOW = "2026-12-01T12:00:00Z"
ENGINE_NAMES = ["prefill-0", "prefill-1", "decode"]


def spec_of(example: str) -> PDDeploymentSpec:
    return validate_spec(load_example(example)["spec"])


def pod_of(spec: PDDeploymentSpec) -> dict[str, Any]:
    return render.pod(layout.build(OWNER, spec))


def engines(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"]["containers"] if c["name"] != render.PROXY_CONTAINER]


def kv_config(container: dict[str, Any]) -> dict[str, Any]:
    argv = container["command"]
    config: dict[str, Any] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    return config


@pytest.mark.parametrize("example", ["qwen3-235b-2p1d.yaml", "simulated-2p1d.yaml"])
def test_one_container_per_instance_with_disjoint_gpus_and_ports(example: str) -> None:
    spec = spec_of(example)
    pod = pod_of(spec)
    assert [c["name"] for c in engines(pod)] == ENGINE_NAMES
    gpus = [set(e.gpus) for e in engine_containers(spec)]
    assert [sorted(g) for g in gpus] == [[0, 1], [2, 3], [4, 5, 6, 7]]
    ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]]
    assert len(ports) == len(set(ports)), ports
    names = [p["name"] for c in pod["spec"]["containers"] for p in c["ports"]]
    assert len(names) == len(set(names)) and all(len(n) <= 15 for n in names), names


def test_each_instance_registers_its_own_ports_and_keeps_the_role_settings() -> None:
    pod = pod_of(spec_of("qwen3-235b-2p1d.yaml"))
    by_name = {c["name"]: c for c in engines(pod)}
    for name, (http, handshake, notify) in {"prefill-0": (20005, 6301, 6105), "prefill-1": (20006, 6311, 6115)}.items():
        c = by_name[name]
        extra = kv_config(c)["kv_connector_extra_config"]
        assert (extra["http_port"], extra["handshake_port"], extra["notify_port"]) == tuple(
            str(p) for p in (http, handshake, notify)
        )
        assert kv_config(c)["kv_role"] == "kv_producer"
        argv = c["command"]
        assert argv[argv.index("--port") + 1] == str(http) and argv[argv.index("-tp") + 1] == "2"
        # every rank's listener is a container port: base .. base + tp - 1
        assert {p["containerPort"] for p in c["ports"]} == {http, handshake, handshake + 1, notify, notify + 1}
        assert c["resources"]["limits"]["amd.com/gpu"] == "2"
    assert kv_config(by_name["decode"])["kv_role"] == "kv_consumer"


def test_a_one_entry_instance_list_is_named_by_index() -> None:
    raw = load_example("simulated-2p1d.yaml")["spec"]
    raw["prefill"]["instances"] = raw["prefill"]["instances"][:1]
    raw["decode"] = {"gpus": "2-3", "tensorParallelSize": 2}
    assert [c["name"] for c in engines(pod_of(validate_spec(raw)))] == ["prefill-0", "decode"]


def test_host_devices_pin_each_instance_and_the_first_engine_holds_the_spare_gpus() -> None:
    raw = load_example("qwen3-235b-2p1d.yaml")["spec"]
    raw["gpuAllocation"] = {"strategy": "hostDevices"}
    raw["decode"] = {**raw["decode"], "gpus": "4-5", "tensorParallelSize": 2}
    containers = engines(pod_of(validate_spec(raw)))
    visible = [next(e["value"] for e in c["env"] if e["name"] == "HIP_VISIBLE_DEVICES") for c in containers]
    assert visible == ["0,1", "2,3", "4,5"]
    # GPUs 6-7 are used by no engine: the first engine requests them so the scheduler gives them to no one else
    assert [c["resources"]["limits"]["amd.com/gpu"] for c in containers] == ["4", "2", "2"]


def test_dra_claims_one_request_per_instance() -> None:
    raw = load_example("qwen3-235b-2p1d.yaml")["spec"]
    raw["gpuAllocation"] = DRA
    template = render.claim_template(layout.build(OWNER, validate_spec(raw)))
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [("prefill-0", 2), ("prefill-1", 2), ("decode", 4)]
    assert '["0000:46:00.0", "0000:65:00.0"]' in requests[1]["exactly"]["selectors"][0]["cel"]["expression"]


def test_one_prefill_tp4_and_two_decode_tp2() -> None:
    raw = {
        "model": "Qwen/Qwen3-235B-A22B-FP8",
        "engine": "simulated",
        "engineVersion": "0.34.0",
        "decode": {
            "tensorParallelSize": 2,
            "instances": [
                {"gpus": "4-5", "ports": {"http": 40005, "handshake": 7301, "notify": 7501}},
                {"gpus": "6-7", "ports": {"http": 40006, "handshake": 7311, "notify": 7511}},
            ],
        },
    }
    pod = pod_of(validate_spec(raw))
    assert [c["name"] for c in engines(pod)] == ["prefill", "decode-0", "decode-1"]
    assert [p["name"] for p in engines(pod)[2]["ports"]][:2] == ["d1-http", "d1-handshake"]


def test_the_connector_rank_offsets_of_two_instances_must_not_meet() -> None:
    raw = load_example("simulated-2p1d.yaml")["spec"]
    # prefill-0 is TP2: its handshake ranks bind 6301 and 6302, so a second base at 6302 collides
    raw["prefill"]["instances"][1]["ports"]["handshake"] = 6302
    with pytest.raises(SpecError) as err:
        validate_spec(raw)
    assert any("ports must be distinct" in line for line in err.value.problems)
    raw["prefill"]["instances"][1]["ports"]["handshake"] = 6303
    validate_spec(raw)


def test_tensor_parallel_must_divide_the_attention_heads_of_a_known_model_only() -> None:
    raw = {
        "model": "Qwen/Qwen3-235B-A22B-FP8",
        "engine": "simulated",
        "prefill": {"gpus": "0-2", "tensorParallelSize": 3},
        "decode": {"gpus": "4-6", "tensorParallelSize": 3},
    }
    with pytest.raises(SpecError) as err:
        validate_spec(raw)
    assert any(line.startswith("spec.model: tensorParallelSize must divide") for line in err.value.problems)
    validate_spec({**raw, "model": "my-org/unknown-model"})


def observed(spec: PDDeploymentSpec, ready: set[str]) -> dict[str, Any]:
    pod = pod_of(spec)
    statuses = [container_status(c["name"], c["name"] in ready) for c in pod["spec"]["containers"]]
    view = pod_view(running_pod(pod, statuses=statuses))
    replicas = (ReplicaObservation(0, view),)
    obs = Observation(generation=1, now=NOW, spec=spec, layout=layout.build(OWNER, spec), replicas=replicas)
    return observe.wire(observe.status(obs))


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_prefill_ready_needs_every_prefill_instance_and_counts_them() -> None:
    spec = spec_of("simulated-2p1d.yaml")
    partly = observed(spec, {"prefill-0", "decode", "proxy"})
    prefill = condition(partly, "PrefillReady")
    assert prefill["status"] == "False" and prefill["message"] == "1/2 ready; not ready: prefill-1"
    assert partly["containersReady"] == "3/4" and partly["phase"] != "Ready"
    assert [(r["name"], r["role"], r["ready"]) for r in partly["roles"]] == [
        ("prefill-0", "prefill", True),
        ("prefill-1", "prefill", False),
        ("decode", "decode", True),
        ("proxy", "proxy", True),
    ]
    full = observed(spec, set(ENGINE_NAMES) | {"proxy"})
    assert condition(full, "PrefillReady")["message"] == "2/2 ready; prefill-0, prefill-1 ready"
    assert condition(full, "DecodeReady")["message"] == "decode ready"
    assert (full["ready"], full["containersReady"]) == ("1/1", "4/4")


def test_gpu_assignment_lists_every_instance() -> None:
    spec = spec_of("qwen3-235b-2p1d.yaml")
    assert observe.gpu_assignment(layout.build(OWNER, spec)).prefill == "2+2 (plugin-chosen)"
    raw = load_example("qwen3-235b-2p1d.yaml")["spec"]
    raw["gpuAllocation"] = {"strategy": "hostDevices"}
    pinned = observe.gpu_assignment(layout.build(OWNER, validate_spec(raw)))
    assert (pinned.prefill, pinned.decode) == ("0-1, 2-3", "4-7")
