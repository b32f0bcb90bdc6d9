"""The rendered command lines parse with the real CLIs of pdctl engine, proxy, bench (and sim-engine)."""

from __future__ import annotations

import importlib

import pytest

from pd_operator import layout
from pd_operator.engine_cmd import bench_command, engine_command, engine_containers, proxy_command
from pd_operator.validation import validate_spec
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
