"""Rendering: the engine command lines match the seed's appendix flag for flag; the pod is safe by default."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator import api, layout, render
from pd_operator.command_lines import engine_command, engine_containers
from pd_operator.commands import render as render_command
from pd_operator.validation import validate_spec
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from tests.operator.conftest import DRA, EXAMPLES, load_example, render_argv

GOLDEN = Path(__file__).with_name("golden") / "seed_appendix.sh"
ALLOWED_EXTRA_CONFIG = {"host_ip", "backend", "transfer_timeout", "defer_timeout", "read_mode"}
# Every kv_connector_extra_config key vLLM 0.29's MoRIIOConnector reads (moriio_common.py:
# MoRIIOConfig.from_vllm_config, get_moriio_mode, resolve_host_ip; moriio_connector.py:
# _set_port_defaults, MoRIIOConnectorScheduler.__init__). Any other key would be silently ignored.
PINNED_CONNECTOR_KEYS = {
    "proxy_ip",
    "proxy_ping_port",
    "http_port",
    "handshake_port",
    "notify_port",
    "host_ip",
    "backend",
    "read_mode",
    "transfer_timeout",
    "defer_timeout",
    "qp_per_transfer",
    "post_batch_size",
    "num_workers",
}
# Flags the operator renders beyond the appendix: decode in read mode needs piecewise CUDA graphs.
PIECEWISE = ("--compilation-config", '{"cudagraph_mode":"PIECEWISE"}')
OWNER = layout.Owner(name="qwen", namespace="llm", uid="1234-uid", generation=3)


def seed_sections() -> dict[str, tuple[dict[str, str], list[str]]]:
    """Each appendix section as (environment, argv after `vllm serve`)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("### "):
            current = line[4:]
            sections[current] = []
        elif current and not line.startswith("#"):
            sections[current].append(line.split("    #")[0])
    parsed = {}
    for name, lines in sections.items():
        words = shlex.split("\n".join(lines).replace("\\\n", " ").replace("export ", ""))
        serve = words.index("vllm")
        env = dict(w.split("=", 1) for w in words[:serve])
        parsed[name] = (env, words[serve + 2 :])
    return parsed


def pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """[model, -tp, 4, --flag, ...] -> [(flag, value-or-None)] (the model excluded)."""
    out: list[tuple[str, str | None]] = []
    for word in args[1:]:
        if word.startswith("-"):
            out.append((word, None))
        else:
            out[-1] = (out[-1][0], word)
    return out


def lay(spec: Any) -> layout.Layout:
    return layout.build(OWNER, spec)


def spec_of(example: str, **changes: Any) -> Any:
    doc = load_example(example)
    doc["spec"].update(changes)
    return validate_spec(doc["spec"])


def write_example_in(mode: str, **changes: Any) -> Any:
    """The write example in transfer mode ``mode``, with its RDMA settings kept."""
    kv = {**load_example("qwen3-235b-write.yaml")["spec"]["kvTransfer"], "transferMode": mode}
    return spec_of("qwen3-235b-write.yaml", kvTransfer=kv, **changes)


def container(spec: Any, name: str) -> dict[str, Any]:
    pod = render.pod(lay(spec))
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def serve_args(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("serve") + 1 :]


def env_values(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<ref>") for e in c["env"]}


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("mode", ["write", "read"])
def test_engine_command_matches_the_seed_flag_for_flag(role: str, mode: str) -> None:
    _seed_env, seed_args = seed_sections()[role]
    args = serve_args(container(write_example_in(mode), role)["command"])
    assert args[0] == seed_args[0] == "Qwen/Qwen3-235B-A22B-FP8"
    rendered, seed = pairs(args), pairs(seed_args)
    assert ("--host", "127.0.0.1") in rendered, "hostNetwork: the HTTP server on the pod's loopback only"
    rendered.remove(("--host", "127.0.0.1"))
    if role == "decode" and mode == "read":
        assert rendered[-1] == PIECEWISE, "the one flag beyond the appendix, after the kv-transfer config"
        rendered = rendered[:-1]
    assert sorted(f for f, _ in rendered) == sorted(f for f, _ in seed)
    if role == "prefill":
        assert [f for f, _ in rendered] == [f for f, _ in seed], "same order as the appendix"
    config, seed_config = dict(rendered).pop("--kv-transfer-config"), dict(seed).pop("--kv-transfer-config")
    assert {k: v for k, v in rendered if k != "--kv-transfer-config"} == {
        k: v for k, v in seed if k != "--kv-transfer-config"
    }
    ours, theirs = json.loads(str(config)), json.loads(str(seed_config))
    extra, seed_extra = ours.pop("kv_connector_extra_config"), theirs.pop("kv_connector_extra_config")
    assert ours == theirs
    assert {k: extra[k] for k in seed_extra} == seed_extra
    assert set(extra) - set(seed_extra) <= ALLOWED_EXTRA_CONFIG
    assert extra["host_ip"] == "$(POD_IP)"
    assert ("read_mode" in extra) == (mode == "read")


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("mode", ["write", "read"])
def test_engine_env_matches_the_seed_with_pinned_gpus(role: str, mode: str) -> None:
    seed_env, _ = seed_sections()[role]
    # The appendix's VLLM_MORIIO_CONNECTOR_READ_MODE=1 ("unset for write mode") is left out in both
    # modes: vLLM 0.29 ignores it with a deprecation warning; read_mode in the extra config decides.
    del seed_env["VLLM_MORIIO_CONNECTOR_READ_MODE"]
    spec = write_example_in(mode, gpuAllocation={"strategy": "hostDevices"})
    env = env_values(container(spec, role))
    assert {k: env[k] for k in seed_env} == seed_env
    assert list(env)[: len(seed_env)] == list(seed_env), "same order as the appendix"
    assert env["VLLM_HOST_IP"] == env["POD_IP"] == "<ref>"
    assert "VLLM_MORIIO_CONNECTOR_READ_MODE" not in env


@pytest.mark.parametrize("mode", ["write", "read"])
def test_extra_config_keys_are_ones_the_pinned_connector_reads(mode: str) -> None:
    spec = write_example_in(mode)
    for role in ("prefill", "decode"):
        args = serve_args(container(spec, role)["command"])
        extra = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
        assert set(extra) <= PINNED_CONNECTOR_KEYS
        assert (extra.get("read_mode") is True) == (mode == "read"), "0.29 reads the mode only from here"


def test_read_mode_renders_piecewise_cuda_graphs_on_decode_only() -> None:
    read = write_example_in("read")
    assert dict(pairs(serve_args(container(read, "decode")["command"])))[PIECEWISE[0]] == PIECEWISE[1]
    assert PIECEWISE[0] not in serve_args(container(read, "prefill")["command"]), "the producer never waits"
    write = write_example_in("write")
    assert PIECEWISE[0] not in serve_args(container(write, "decode")["command"])


@pytest.mark.parametrize(
    "extra_args",
    [
        ["-cc.cudagraph_mode=FULL_DECODE_ONLY"],
        ["--compilation-config", '{"cudagraph_mode": "NONE", "max_cudagraph_capture_size": 64}'],
        ['--compilation_config={"cudagraph_mode": "PIECEWISE"}'],
    ],
)
def test_explicit_cudagraph_mode_replaces_the_operators(extra_args: list[str]) -> None:
    decode = {**load_example("qwen3-235b-write.yaml")["spec"]["decode"], "extraArgs": extra_args}
    args = serve_args(container(write_example_in("read", decode=decode), "decode")["command"])
    assert PIECEWISE[1] not in args and args[-len(extra_args) :] == extra_args


def test_device_plugin_leaves_visible_devices_unset() -> None:
    env = env_values(container(spec_of("qwen3-235b-write.yaml"), "prefill"))
    assert not {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"} & env.keys()


@pytest.mark.parametrize("index", [0, 1])
def test_colocated_engines_match_the_seed_standard_serving(index: int) -> None:
    seed_env, seed_args = seed_sections()[f"standard-{index}"]
    c = container(spec_of("qwen3-235b-colocated.yaml", gpuAllocation={"strategy": "hostDevices"}), f"engine-{index}")
    rendered = dict(pairs(serve_args(c["command"])))
    assert {k: rendered[k] for k, _ in pairs(seed_args)} == dict(pairs(seed_args))
    assert set(rendered) - {f for f, _ in pairs(seed_args)} == {"--gpu_memory_utilization"}
    env = env_values(c)
    assert {k: env[k] for k in seed_env} == seed_env
    assert c["command"][:10] == [
        "pdctl",
        "engine",
        "--role",
        "engine",
        "--gpus",
        "4",
        "--backend",
        "none",
        "--ports",
        str(8100 + 100 * index),
    ]


def test_launcher_wraps_vllm_with_preflight_flags() -> None:
    cmd = container(spec_of("qwen3-235b-write.yaml"), "prefill")["command"]
    assert cmd[: cmd.index("--") + 3] == [
        "pdctl",
        "engine",
        "--role",
        "prefill",
        "--gpus",
        "4",
        "--backend",
        "rdma",
        "--ports",
        "20005,6301,6302,6303,6304,6105,6106,6107,6108",
        "--vllm-version",
        PINNED_VLLM_VERSION,
        "--",
        "vllm",
        "serve",
    ]


@pytest.mark.parametrize("example", ["simulated-write.yaml", "simulated-read.yaml", "simulated-colocated.yaml"])
def test_simulated_engine_swaps_only_the_executable(example: str) -> None:
    sim = validate_spec(load_example(example)["spec"])
    real = sim.model_copy(update={"engine": "vllm"})
    for eng in engine_containers(sim):
        sim_cmd, real_cmd = engine_command(sim, eng), engine_command(real, eng)
        sep = sim_cmd.index("--")
        assert sim_cmd[:sep] == [
            *real_cmd[: real_cmd.index("--")][:4],
            "--gpus",
            "0",
            "--backend",
            "none",
            *real_cmd[8:sep],
        ]
        after, real_after = sim_cmd[sep + 1 :], real_cmd[sep + 1 :]
        assert after[:2] == ["pdctl", "sim-engine"] and real_after[:2] == ["vllm", "serve"]
        assert after[2 : len(real_after)] == real_after[2:]
        assert after[len(real_after) :] == [
            "--profile",
            sim.simulation.profile,
            "--time-scale",
            f"{sim.simulation.time_scale:g}",
        ]


def test_simulated_pod_requests_no_gpus_unless_asked() -> None:
    spec = validate_spec(load_example("simulated-write.yaml")["spec"])
    for c in render.pod(lay(spec))["spec"]["containers"]:
        assert "amd.com/gpu" not in c.get("resources", {}).get("limits", {})
    reserved = spec.model_copy(update={"simulation": spec.simulation.model_copy(update={"reserve_gpus": True})})
    limits = [c["resources"].get("limits", {}) for c in render.pod(lay(reserved))["spec"]["containers"][:2]]
    assert limits == [{"amd.com/gpu": "4"}, {"amd.com/gpu": "4"}]


@pytest.mark.parametrize(("tp", "dp"), [(4, 1), (1, 4)])
def test_engines_reserve_every_rank_port_the_connector_binds(tp: int, dp: int) -> None:
    prefill = {"gpus": "0-3", "tensorParallelSize": tp, "dataParallelSize": dp}
    c = container(spec_of("qwen3-235b-write.yaml", prefill=prefill, engineVersion="0.34.0"), "prefill")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {
        "p-http": 20005,
        "p-handshake": 6301,
        "p-handshake-1": 6302,
        "p-handshake-2": 6303,
        "p-handshake-3": 6304,
        "p-notify": 6105,
        "p-notify-1": 6106,
        "p-notify-2": 6107,
        "p-notify-3": 6108,
    }
    assert all(len(name) <= 15 for name in ports), "IANA service names"
    preflight = c["command"][c["command"].index("--ports") + 1]
    assert sorted(int(p) for p in preflight.split(",")) == sorted(ports.values())


def test_proxy_command_follows_the_contract() -> None:
    spec = spec_of("qwen3-235b-write.yaml")
    cmd = container(spec, "proxy")["command"]
    assert cmd == [
        "pdctl",
        "proxy",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--registration-address",
        "tcp://127.0.0.1:36367",
        "--mode",
        "disaggregated",
        "--transfer-mode",
        "write",
        "--engine-host",
        "127.0.0.1",  # hostNetwork: the engines listen on the pod's loopback only
        "--admin-port",
        "8001",
        "--config-file",
        "/etc/pd-proxy/proxy.json",
        "--network",
        "host",  # hostNetwork: loopback is the node's, so /status asks every reader for the admin key
        # on deletion: serve on, not ready, for 5 s (grace / 4, at most 5), then drain for the rest less 1 s
        "--drain-delay",
        "5",
        "--drain-timeout",
        "294",
        "--canary-interval",
        "300",
        "--migration-limit",
        "1",
        # the only registrations the proxy accepts: each engine's heartbeat, vLLM's G2 frame, literally
        "--expected-engine",
        '{"type":"P","http_address":"$(POD_IP):20005","zmq_address":"host:$(POD_IP),handshake:6301,notify:6105",'
        '"dp_size":1,"tp_size":4,"transfer_mode":"WRITE"}',
        "--expected-engine",
        '{"type":"D","http_address":"$(POD_IP):40005","zmq_address":"host:$(POD_IP),handshake:7301,notify:7501",'
        '"dp_size":1,"tp_size":4,"transfer_mode":"WRITE"}',
        # derived from the engines: kvTransfer defer (60) + transfer (30) timeouts + 5 s, decode's maxNumSeqs
        "--kv-wait-timeout",
        "95",
        "--kv-wait-limit",
        "95",
        "--decode-max-in-flight",
        "64",
    ]
    colocated = container(spec_of("qwen3-235b-colocated.yaml"), "proxy")["command"]
    assert colocated[colocated.index("--mode") : colocated.index("--admin-port")] == [
        "--mode",
        "colocated",
        "--engine",
        "http://127.0.0.1:8100",
        "--engine",
        "http://127.0.0.1:8200",
    ]


def test_proxy_exports_its_spans_only_when_given_an_endpoint() -> None:
    assert "--otlp-traces-endpoint" not in container(spec_of("qwen3-235b-write.yaml"), "proxy")["command"]
    url = "http://otel-collector.observability:4318/v1/traces"
    spec = spec_of("qwen3-235b-write.yaml", proxy={"otlpTracesEndpoint": url})
    cmd = container(spec, "proxy")["command"]
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == url
    with pytest.raises(ValueError, match="otlpTracesEndpoint"):
        spec_of("qwen3-235b-write.yaml", proxy={"otlpTracesEndpoint": "collector:4318"})


def test_engines_dial_the_proxy_on_loopback_only() -> None:
    spec = spec_of("qwen3-235b-write.yaml")
    for name in ("prefill", "decode"):
        args = serve_args(container(spec, name)["command"])
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert config["kv_connector_extra_config"]["proxy_ip"] == "127.0.0.1"


def test_pod_shape_probes_and_security() -> None:
    spec = spec_of("qwen3-235b-write.yaml")
    pod = render.pod(lay(spec))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["prefill", "decode", "proxy"]
    assert pod["metadata"]["ownerReferences"][0] == {
        "apiVersion": "pd.serving.dev/v1alpha1",
        "kind": "PDDeployment",
        "name": "qwen",
        "uid": "1234-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    prefill = pod["spec"]["containers"][0]
    assert prefill["resources"]["limits"] == {"amd.com/gpu": "4", "rdma/hca_shared_devices_a": "1"}
    assert prefill["startupProbe"]["failureThreshold"] * prefill["startupProbe"]["periodSeconds"] >= 3600
    assert {"IPC_LOCK", "SYS_PTRACE"} == set(prefill["securityContext"]["capabilities"]["add"])
    assert prefill["securityContext"]["capabilities"]["drop"] == ["ALL"]
    shm = {v["name"]: v for v in pod["spec"]["volumes"]}["dshm-prefill"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    proxy = pod["spec"]["containers"][2]
    assert proxy["securityContext"]["runAsNonRoot"] is True and proxy["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "lifecycle" not in proxy
    assert pod["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH] == render.spec_hash(pod["spec"])


@pytest.mark.parametrize(("grace", "bound"), [(300, "299"), (20, "19"), (5, "4"), (0, "0")])
def test_engines_stop_only_after_the_proxy_has_drained(grace: int, bound: str) -> None:
    """The kubelet SIGTERMs every container at once: each engine's preStop hook waits while the proxy
    (admin port 8001) drains, for at most its drain bound (delay + timeout: 5 s + 294 s of a 300 s grace).
    The bound ends before the grace period, which the kubelet enforces whatever the hook does, so the
    engines' SIGTERM comes before their SIGKILL."""
    pod = render.pod(lay(spec_of("qwen3-235b-write.yaml", terminationGracePeriodSeconds=grace)))
    *engines, proxy = pod["spec"]["containers"]
    hook = ["pdctl", "wait-proxy-gone", "--port", "8001", "--timeout", bound]
    assert [e["lifecycle"] for e in engines] == [{"preStop": {"exec": {"command": hook}}}] * 2
    assert "lifecycle" not in proxy  # the proxy drains on SIGTERM itself
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace
    assert float(bound) < grace or grace == 0


def test_with_host_network_the_engines_listen_on_loopback_and_are_probed_there() -> None:
    """hostNetwork: the pod's loopback is the node's. The engines' HTTP servers bind it only (the proxy,
    in the same pod, dials them there), the kubelet probes them there; the side channels keep the node's
    address, which the connector advertises to the peer engine."""
    pod = render.pod(lay(spec_of("qwen3-235b-write.yaml")))
    *engines, proxy = pod["spec"]["containers"]
    for engine in engines:
        args = serve_args(engine["command"])
        assert args[args.index("--host") + 1] == "127.0.0.1"
        assert '"host_ip":"$(POD_IP)"' in args[args.index("--kv-transfer-config") + 1]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert engine[probe]["httpGet"]["host"] == "127.0.0.1"
    assert proxy["command"][proxy["command"].index("--engine-host") + 1] == "127.0.0.1"
    assert "host" not in proxy["readinessProbe"]["httpGet"]  # the proxy's API port answers on the node
    plain = render.pod(lay(spec_of("qwen3-235b-read.yaml")))  # no hostNetwork
    *engines, proxy = plain["spec"]["containers"]
    assert all(
        "--host" not in serve_args(e["command"]) and "host" not in e["readinessProbe"]["httpGet"] for e in engines
    )
    assert "--engine-host" not in proxy["command"]


def test_only_rdma_engines_lock_memory() -> None:
    """IPC_LOCK is for RDMA memory registration: colocated engines move no KV and get SYS_PTRACE only."""
    colocated = render.pod(lay(spec_of("qwen3-235b-colocated.yaml")))["spec"]["containers"][0]
    assert colocated["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert colocated["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


def test_spec_change_changes_the_hash() -> None:
    a = render.pod(lay(spec_of("simulated-write.yaml")))
    b = render.pod(lay(spec_of("simulated-write.yaml", image="other:1")))
    assert (
        a["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH]
        != b["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH]
    )


def test_nic_resource_is_requested_by_engines_only() -> None:
    pod = render.pod(lay(spec_of("qwen3-235b-read.yaml")))
    limits = [c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]]
    assert limits[0] == limits[1] == {"amd.com/gpu": "4", "rdma/hca_shared_devices_a": "1"}
    assert "rdma/hca_shared_devices_a" not in limits[2] and "hostNetwork" not in pod["spec"]


def test_host_devices_pin_ranges_and_reserve_the_whole_node() -> None:
    spec = spec_of(
        "qwen3-235b-write.yaml",
        gpuAllocation={"strategy": "hostDevices"},
        prefill={"gpus": "0-1", "tensorParallelSize": 2},
        decode={"gpus": "4-7"},
        engineVersion="0.34.0",
    )
    pod = render.pod(lay(spec))
    prefill, decode = pod["spec"]["containers"][:2]
    assert (
        env_values(prefill)["CUDA_VISIBLE_DEVICES"] == "0,1" and env_values(decode)["HIP_VISIBLE_DEVICES"] == "4,5,6,7"
    )
    assert prefill["securityContext"]["privileged"] is True
    total = sum(int(c["resources"]["limits"]["amd.com/gpu"]) for c in (prefill, decode))
    assert total == 8


def test_dra_renders_a_claim_template_selecting_by_pci_address() -> None:
    spec = spec_of("qwen3-235b-write.yaml", gpuAllocation=DRA)
    children = render.children(lay(spec))
    template = children.applied[0]
    name = template["metadata"]["name"]
    assert template["kind"] == "ResourceClaimTemplate" and re.fullmatch(r"qwen-gpus-[0-9a-f]{10}", name)
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["prefill", "decode"]
    listed = '["0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"]'
    assert requests[1]["exactly"]["selectors"][0]["cel"]["expression"] == (
        f'("pciBusID" in device.attributes["resource.kubernetes.io"] && '
        f'device.attributes["resource.kubernetes.io"].pciBusID in {listed}) || '
        f'("pciAddr" in device.attributes["gpu.amd.com"] && device.attributes["gpu.amd.com"].pciAddr in {listed})'
    )
    pod = children.pod
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": name}]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus", "request": "prefill"}]


def test_a_changed_claim_template_gets_a_new_name_and_rolls_the_pod() -> None:
    """A ResourceClaimTemplate's spec is immutable: a change is a new template, and the pod follows it."""
    before = render.children(lay(spec_of("qwen3-235b-write.yaml", gpuAllocation=DRA)))
    moved = spec_of(
        "qwen3-235b-write.yaml",
        gpuAllocation=DRA,
        prefill={"gpus": "0-1", "tensorParallelSize": 2},
        engineVersion="0.34.0",
    )
    after = render.children(lay(moved))
    names = [c.applied[0]["metadata"]["name"] for c in (before, after)]
    assert names[0] != names[1]
    hashes = [c.pods[0]["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH] for c in (before, after)]
    assert hashes[0] != hashes[1]
    again = render.children(lay(spec_of("qwen3-235b-write.yaml", gpuAllocation=DRA)))
    assert again.applied[0]["metadata"]["name"] == names[0]  # same content, same name: nothing to replace


def test_service_exposes_only_the_proxy_api_port() -> None:
    svc = render.service(lay(spec_of("qwen3-235b-write.yaml")))
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == {"pd.serving.dev/deployment": "qwen", "app.kubernetes.io/component": "serving"}


def test_network_policy_admits_api_from_anywhere_and_admin_from_the_operator() -> None:
    policy = render.network_policy(lay(spec_of("qwen3-235b-write.yaml")), "ops")
    api_rule, admin_rule, metrics_rule, self_rule = policy["spec"]["ingress"]
    assert api_rule == {"ports": [{"port": 8000, "protocol": "TCP"}]}
    assert admin_rule["ports"] == [{"port": 8001, "protocol": "TCP"}]
    # The operator's label in the operator's namespace only: a tenant's pod may carry the label, not move there.
    assert admin_rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {"pd.serving.dev/operator": "true"}},
        }
    ]
    assert self_rule["from"][0]["podSelector"]["matchLabels"] == policy["spec"]["podSelector"]["matchLabels"]
    # Prometheus in namespace monitoring by default: the engines' vLLM /metrics (HTTP ports) and the proxy's
    assert metrics_rule["from"] == [api.DEFAULT_METRICS_PEER]
    assert [p["port"] for p in metrics_rule["ports"]] == [20005, 40005, 8001]


def test_metrics_scrapers_are_configurable_and_can_be_none() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"team": "observability"}}}
    custom = render.network_policy(lay(spec_of("simulated-2p1d.yaml", networkPolicy={"metricsFrom": [peer]})))
    rule = next(r for r in custom["spec"]["ingress"] if r.get("from") == [peer])
    engine_ports = [
        port for e in lay(spec_of("simulated-2p1d.yaml")).engines for n, port in e.ports if n.endswith("-http")
    ]
    assert [p["port"] for p in rule["ports"]] == [*engine_ports, 8001] and len(engine_ports) == 3
    closed = render.network_policy(lay(spec_of("simulated-write.yaml", networkPolicy={"metricsFrom": []})))
    assert len(closed["spec"]["ingress"]) == 3


def test_probe_job_runs_the_operator_image_when_given() -> None:
    job = render.probe_job(
        lay(spec_of("simulated-write.yaml")), "qwen-goodput-1", "ghcr.io/pd-serving/pd-operator:0.1.0"
    )
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/pd-serving/pd-operator:0.1.0"


def test_probe_job_runs_bench_against_the_service() -> None:
    job = render.probe_job(lay(spec_of("simulated-write.yaml")), "qwen-goodput-1")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:4] == ["pdctl", "bench", "--url", "http://qwen.llm.svc:8000"]
    assert c["command"][-2:] == ["--result-file", "/dev/termination-log"]
    assert c["terminationMessagePolicy"] == "File" and job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_pdctl_render_prints_every_object(path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert render_command.main(render_argv(path, tmp_path)) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    kinds_applied = ["Service", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"]
    assert kinds[:6] == ["Secret", *kinds_applied, "Pod"] and kinds[-1] == "Job"


def test_pdctl_render_refuses_an_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = load_example("simulated-write.yaml")
    doc["spec"]["prefill"]["gpus"] = "0-2"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert render_command.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.prefill.gpus: gpus must contain exactly tensorParallelSize * dataParallelSize GPUs" in err


def test_pdctl_render_refuses_data_and_tensor_parallel_in_one_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = load_example("qwen3-235b-write.yaml")
    doc["spec"]["prefill"].update(tensorParallelSize=2, dataParallelSize=2)
    bad = tmp_path / "dp-tp.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert render_command.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.prefill.dataParallelSize: prefill.dataParallelSize > 1 needs prefill.tensorParallelSize 1" in err
    assert "base + dp_rank + tp_rank while the dialing side uses base + dp_rank * remote_tp + tp_rank" in err


def test_pdctl_render_reports_unreadable_files(tmp_path: Path) -> None:
    assert render_command.main([str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "junk.yaml").write_text("kind: [unclosed")
    assert render_command.main([str(tmp_path / "junk.yaml")]) == 2
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert render_command.main([str(tmp_path / "list.yaml")]) == 2


# ---- the pod's credentials ----------------------------------------------------------------------------------


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }


@pytest.mark.parametrize("example", ["simulated-write.yaml", "simulated-colocated.yaml", "qwen3-235b-2p1d.yaml"])
def test_every_engine_and_the_proxy_read_the_engine_key_from_the_deployments_secret(example: str) -> None:
    children = render.children(lay(spec_of(example)))
    secret = children.credentials
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == f"{OWNER.name}-credentials"
    assert "data" not in secret and "stringData" not in secret, "the shell draws the values when creating it"
    [ref] = secret["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"]) == (OWNER.uid, True)
    key_ref = {"name": secret["metadata"]["name"], "key": "engine-key"}
    for container in children.pod["spec"]["containers"]:
        assert _secret_refs(container)["VLLM_API_KEY"] == key_ref, container["name"]
    assert secret not in children.applied, "never applied: a resync must not replace the keys"


def test_the_engine_key_is_not_in_the_command_lines() -> None:
    pod = render.pod(lay(spec_of("simulated-write.yaml")))
    assert all("--api-key" not in c["command"] for c in pod["spec"]["containers"])


def test_the_admin_key_reaches_the_proxy_the_router_and_only_on_the_nodes_network_the_engines() -> None:
    key_ref = {"name": f"{OWNER.name}-credentials", "key": "admin-key"}
    pod_network = lay(spec_of("simulated-write.yaml", router={"enabled": True}))
    proxy = render.pod(pod_network)["spec"]["containers"][-1]
    assert _secret_refs(proxy)["PD_PROXY_ADMIN_KEY"] == key_ref and "--network" not in proxy["command"]
    [router] = [o for o in render.router(pod_network) if o["kind"] == "Deployment"]
    assert _secret_refs(router["spec"]["template"]["spec"]["containers"][0])["PD_PROXY_ADMIN_KEY"] == key_ref
    engines = render.pod(pod_network)["spec"]["containers"][:-1]
    assert all("PD_PROXY_ADMIN_KEY" not in _secret_refs(c) for c in engines), "their preStop reads the pod's loopback"
    host = render.pod(lay(spec_of("qwen3-235b-write.yaml")))["spec"]["containers"]
    assert all(_secret_refs(c)["PD_PROXY_ADMIN_KEY"] == key_ref for c in host)
    assert host[-1]["command"][host[-1]["command"].index("--network") + 1] == "host"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_rendered_proxy_never_discovers_engines(path: Path) -> None:
    """Every engine is named to the proxy (--expected-engine, or --engine when colocated), so the gate
    accepts only their frames and registration discovery is off (gate.py: a frame of anything else
    changes nothing)."""
    rendered = lay(spec_of(path.name))
    cmd = rendered.proxy.argv
    named = [cmd[i + 1] for i, word in enumerate(cmd) if word in ("--expected-engine", "--engine")]
    assert len(named) == len(rendered.engines) > 0


@pytest.mark.parametrize("policy", [None, "fail", "recompute"])
def test_the_load_failure_policy_is_a_top_level_kv_transfer_key_only_when_set(policy: str | None) -> None:
    kv = {"kvTransfer": {"loadFailurePolicy": policy}} if policy else {}
    spec = validate_spec({"model": "m", "engine": "simulated", **kv})
    for role in ("prefill", "decode"):
        argv = container(spec, role)["command"]
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config.get("kv_load_failure_policy") == policy
        assert "kv_load_failure_policy" not in config["kv_connector_extra_config"]
