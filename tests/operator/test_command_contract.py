"""The rendered command lines parse with the real CLIs of pdctl engine, proxy, bench (and sim-engine)."""

from __future__ import annotations

import importlib
import json

import msgpack
import pytest

from pd_operator import layout
from pd_operator.api.serving import PROXY_MANAGED_FLAGS
from pd_operator.command_lines import bench_command, engine_command, engine_containers, proxy_command, vllm_serve_args
from pd_operator.validation import validate_spec
from pd_runtime import protocol
from pd_runtime.proxy import gate
from tests.operator.conftest import load_example

OWNER = layout.Owner(name="demo", namespace="ns1")
EVERYTHING = {
    "proxy": {
        "heartbeatTtlSeconds": 9,
        "timeouts": {
            "connectSeconds": 5,
            "prefillSeconds": 300,
            "decodeFirstByteSeconds": 300,
            "idleSeconds": 60,
            "responseSeconds": 1800,
        },
    },
    "goodputProbe": {"enabled": True, "search": True, "seed": 7},
}


@pytest.mark.parametrize("example", ["qwen3-235b-write.yaml", "qwen3-235b-colocated.yaml", "simulated-read.yaml"])
def test_proxy_and_bench_commands_parse(example: str) -> None:
    proxy_cli = importlib.import_module("pd_runtime.proxy.cli")
    bench_cli = importlib.import_module("pd_runtime.bench.cli")
    spec = validate_spec({**load_example(example)["spec"], **EVERYTHING})
    args = proxy_cli.build_parser().parse_args(proxy_command(spec)[2:])
    assert args.port == spec.proxy.port and args.admin_port == spec.proxy.admin_port
    assert args.mode == spec.mode and args.idle_timeout == 60
    bench = bench_cli.build_parser().parse_args(bench_command(spec, layout.service_url(OWNER, spec.proxy.port))[2:])
    assert bench.result_file == "/dev/termination-log" and bench.search and bench.seed == 7


def test_the_managed_proxy_flags_are_every_spelling_of_the_settings_they_set() -> None:
    parser = importlib.import_module("pd_runtime.proxy.cli").build_parser()
    dests = {option: action.dest for option, action in parser._option_string_actions.items()}
    managed = {dests[flag] for flag in PROXY_MANAGED_FLAGS}
    assert {option for option, dest in dests.items() if dest in managed} == set(PROXY_MANAGED_FLAGS)


def test_pdctl_proxy_reads_a_flag_only_as_itself_or_with_its_value_after_an_equals_sign() -> None:
    """What the guard on the proxy's extraArgs relies on: the word before any "=" is the whole flag."""
    parser = importlib.import_module("pd_runtime.proxy.cli").build_parser()
    parsed = parser.parse_args(["--registration-address=tcp://10.0.0.9:5555"])
    assert parsed.registration_address == "tcp://10.0.0.9:5555"
    for words in (["--registration-addr", "tcp://10.0.0.9:5555"], ["--expected", "{}"], ["--admin_port", "9"]):
        with pytest.raises(SystemExit):
            parser.parse_args(words)


@pytest.mark.parametrize("example", ["qwen3-235b-write.yaml", "qwen3-235b-colocated.yaml", "simulated-write.yaml"])
def test_launcher_accepts_engine_commands(example: str) -> None:
    launcher = importlib.import_module("pd_runtime.launcher")
    spec = validate_spec(load_example(example)["spec"])
    for eng in engine_containers(spec):
        cmd = engine_command(spec, eng)
        _needs, rest, _ = launcher.parse(cmd[2:])
        assert rest[:2] in (["vllm", "serve"], ["pdctl", "sim-engine"])


def test_sim_engine_accepts_the_simulated_commands() -> None:
    sim_cli = pytest.importorskip("pd_runtime.sim.cli")
    if not hasattr(sim_cli, "build_parser"):
        pytest.skip("pd_runtime.sim.cli has no build_parser yet")
    spec = validate_spec(load_example("simulated-read.yaml")["spec"])
    for eng in engine_containers(spec):
        cmd = engine_command(spec, eng)
        sim_args = cmd[cmd.index("--") + 3 :]
        sim_cli.build_parser().parse_known_args(sim_args)


POD_IP = "10.1.2.3"
DP4_DECODE = {"tensorParallelSize": 1, "dataParallelSize": 4}


def _vllm_heartbeat(serve: list[str]) -> dict[str, object]:
    """What vLLM 0.31.0's MoRIIOConnectorWorker._ping sends (docs/protocol.md#registration-g2), written from its
    source (moriio_connector.py, MoRIIOConfig.from_vllm_config), not with pd_runtime.protocol:
    http_address ``{local_ip}:{http_port}`` with local_ip the extra config's host_ip; the handshake
    base; the notify base plus dp_rank + tp_rank of the sender, global rank 0, so the base; the global
    data_parallel_size; the TP size; READ when read_mode is true."""
    kv = json.loads(serve[serve.index("--kv-transfer-config") + 1])
    extra = kv["kv_connector_extra_config"]
    dp = serve[serve.index("--data-parallel-size") + 1] if "--data-parallel-size" in serve else "1"
    return {
        "type": "P" if kv["kv_role"] == "kv_producer" else "D",
        "http_address": f"{extra['host_ip']}:{extra['http_port']}",
        "zmq_address": f"host:{extra['host_ip']},handshake:{extra['handshake_port']},notify:{extra['notify_port']}",
        "dp_size": int(dp),
        "tp_size": int(serve[serve.index("-tp") + 1]),
        "transfer_mode": "READ" if extra.get("read_mode") else "WRITE",
    }


@pytest.mark.parametrize(
    ("example", "decode"),
    [
        ("simulated-write.yaml", {}),
        ("simulated-read.yaml", {}),
        ("simulated-2p1d.yaml", {}),
        ("qwen3-235b-write.yaml", {}),
        ("qwen3-235b-read.yaml", DP4_DECODE),
    ],
)
def test_the_proxy_expects_exactly_the_heartbeats_the_rendered_engines_send(
    example: str, decode: dict[str, object]
) -> None:
    """The kubelet expands $(POD_IP) in both command lines; then every engine's frame, as the simulator
    and as vLLM build it, passes the gate the rendered proxy command configures, and nothing else does."""
    proxy_cli = importlib.import_module("pd_runtime.proxy.cli")
    sim_config = importlib.import_module("pd_runtime.sim.config")
    sim_cli = importlib.import_module("pd_runtime.sim.cli")
    raw = load_example(example)["spec"]
    spec = validate_spec({**raw, "decode": {**raw["decode"], **decode}})
    expanded = [a.replace("$(POD_IP)", POD_IP) for a in proxy_command(spec)[2:]]
    parsed = proxy_cli.build_parser().parse_args(expanded).expected_engine
    expected = gate.expected_by_address([gate.parse_expected_engine(text) for text in parsed])
    engines = engine_containers(spec)
    assert len(expected) == len(engines)
    for eng in engines:
        serve = [a.replace("$(POD_IP)", POD_IP) for a in vllm_serve_args(spec, eng)]
        simulated = sim_cli.registration(sim_config.parse_args(serve, env={}))
        for payload in (protocol.g2_payload(simulated), _vllm_heartbeat(serve)):
            frame = protocol.parse_registration(msgpack.packb(payload))
            assert frame is not None and gate.judge(frame, None, 0, expected, 64) is None, payload
            other = protocol.parse_registration(msgpack.packb({**payload, "http_address": "127.0.0.1:45555"}))
            assert other is not None and gate.judge(other, None, 0, expected, 64) is not None
