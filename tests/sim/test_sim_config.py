"""The sim-engine accepts the exact `vllm serve` argv the operator renders."""

from __future__ import annotations

import json

import pytest

from pd_runtime.sim.config import ConfigError, engine_mode, normalise_argv, parse_args

KV_PRODUCER = {
    "kv_connector": "MoRIIOConnector",
    "kv_role": "kv_producer",
    "kv_connector_extra_config": {
        "proxy_ip": "127.0.0.1",
        "proxy_ping_port": "36367",
        "http_port": "20005",
        "handshake_port": "6301",
        "notify_port": "6105",
        "host_ip": "10.1.2.3",
        "backend": "rdma",
        "transfer_timeout": 30,
        "defer_timeout": "45.5",
    },
}

# What the operator renders after `pdctl sim-engine` (seed appendix flags, both spellings, --flag=value).
RENDERED = [
    "Qwen/Qwen3-235B-A22B-FP8",
    "-tp",
    "4",
    "--enable-expert-parallel",
    "--port",
    "20005",
    "--served-model-name",
    "qwen3",
    "--max-num-batched-tokens",
    "4096",
    "--distributed-executor-backend",
    "mp",
    "--gpu_memory_utilization",
    "0.9",
    "--max-model-len",
    "16384",
    "--max_num_seqs",
    "64",
    "--no-enable-prefix-caching",
    "--kv-cache-dtype=fp8",
    "--trust-remote-code",
    "--host",
    "0.0.0.0",
    "--kv-transfer-config",
    json.dumps(KV_PRODUCER),
    "--profile",
    "qwen3-235b-mi300x",
    "--time-scale",
    "10",
]


def test_rendered_prefill_command() -> None:
    cfg = parse_args(RENDERED, env={})
    assert cfg.model == "Qwen/Qwen3-235B-A22B-FP8"
    assert cfg.served_model_names == ("qwen3",)
    assert (cfg.tp, cfg.dp, cfg.port, cfg.host) == (4, 1, 20005, "0.0.0.0")
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len) == (4096, 64, 16384)
    assert cfg.profile == "qwen3-235b-mi300x" and cfg.time_scale == 10.0
    assert engine_mode(cfg) == "producer"
    conn = cfg.connector
    assert conn is not None
    assert (conn.role, conn.read_mode, conn.transfer_mode) == ("P", False, "WRITE")
    assert (conn.proxy_ip, conn.proxy_ping_port, conn.http_port) == ("127.0.0.1", 36367, 20005)
    assert (conn.handshake_port, conn.notify_port, conn.host_ip) == (6301, 6105, "10.1.2.3")
    assert (conn.transfer_timeout_s, conn.defer_timeout_s) == (30.0, 45.5)
    assert cfg.registration == "G2"
    # unknown vLLM flags are kept for the log, values included
    assert "--kv-cache-dtype" in cfg.ignored_flags and "fp8" in cfg.ignored_flags
    assert "--trust-remote-code" in cfg.ignored_flags


@pytest.mark.parametrize(
    ("argv", "backend", "waits"),
    [
        (["m"], "uni", True),
        (["m", "-tp", "2"], "mp", False),
        (["m", "-dp", "2"], "mp", False),
        (["m", "--distributed_executor_backend=uni", "-tp", "2"], "uni", True),
        (["m", "--distributed-executor-backend", "ray"], "ray", False),
        (["m", "--distributed-executor-backend", "external_launcher"], "external_launcher", True),
    ],
)
def test_the_executor_backend_decides_whether_an_idle_engine_reaps(argv: list[str], backend: str, waits: bool) -> None:
    """vLLM's default (``mp`` past one worker, else ``uni``), and only the executors without a KV output
    aggregator leave an expired deferred send to the next forward step (docs/vllm-versions.md)."""
    cfg = parse_args(argv, env={})
    assert (cfg.executor_backend, cfg.reap_waits_for_a_forward_step) == (backend, waits)


def test_flag_spellings_are_normalised() -> None:
    assert normalise_argv(["--max_num_seqs=8", "-tp", "2", "--a_b", "x_y"]) == [
        "--max-num-seqs",
        "8",
        "-tp",
        "2",
        "--a-b",
        "x_y",
    ]
    cfg = parse_args(["m", "--tensor_parallel_size=2", "--max-num-seqs=8", "--data_parallel_size", "2"], env={})
    assert (cfg.tp, cfg.max_num_seqs, cfg.dp) == (2, 8, 2)


def test_without_kv_transfer_config_it_is_a_plain_engine() -> None:
    cfg = parse_args(["m", "--port", "8100"], env={})
    assert cfg.connector is None and engine_mode(cfg) == "colocated"
    assert cfg.profile == "instant" and cfg.time_scale == 1.0
    assert cfg.served_model_names == ("m",)


def _with_extra(**extra: object) -> list[str]:
    config = {"kv_connector": "MoRIIOConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": extra}
    return ["m", "--port", "40005", "--kv-transfer-config", json.dumps(config)]


@pytest.mark.parametrize("value", ["true", "1", "TRUE", True, 1])
def test_read_mode_from_extra_config(value: object) -> None:
    conn = parse_args(_with_extra(read_mode=value), env={}).connector
    assert conn is not None and conn.read_mode and conn.transfer_mode == "READ"


def test_read_mode_from_the_older_environment_variable() -> None:
    conn = parse_args(_with_extra(), env={"VLLM_MORIIO_CONNECTOR_READ_MODE": "1"}).connector
    assert conn is not None and conn.read_mode


def test_defaults_follow_the_connector() -> None:
    conn = parse_args(_with_extra(), env={}).connector
    assert conn is not None
    assert conn.role == "D" and not conn.read_mode
    assert (conn.handshake_port, conn.notify_port) == (6301, 61005)  # docs/protocol.md#rank-ports defaults
    assert conn.http_port == 40005 and conn.proxy_ip == "" and conn.host_ip == "127.0.0.1"
    assert (conn.transfer_timeout_s, conn.defer_timeout_s) == (30.0, 60.0)


def test_advertised_address_precedence() -> None:
    env = {"VLLM_HOST_IP": "10.9.9.9"}
    assert parse_args(_with_extra(), env=env).connector.host_ip == "10.9.9.9"  # type: ignore[union-attr]
    assert parse_args(_with_extra(host_ip="10.0.0.7"), env=env).connector.host_ip == "10.0.0.7"  # type: ignore[union-attr]


def test_sim_knobs_from_flags_and_environment() -> None:
    cfg = parse_args(["m", "--sim-registration", "g1", "--sim-crash-after", "3", "--sim-eos-first-token"], env={})
    assert cfg.registration == "G1" and cfg.faults.crash_after == 3 and cfg.faults.eos_first_token
    env = {"PD_SIM_PREFILL_ERROR": "503", "PD_SIM_DROP_NOTIFY": "0.5", "PD_SIM_NO_REGISTER": "1"}
    faults = parse_args(["m"], env=env).faults
    assert (faults.prefill_error, faults.drop_notify, faults.no_register) == (503, 0.5, True)
    # a flag wins over the environment
    assert parse_args(["m", "--sim-prefill-error", "404"], env=env).faults.prefill_error == 404


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "MODEL is required"),
        (["m", "--kv-transfer-config", "{nope"], "not JSON"),
        (["m", "--kv-transfer-config", '{"kv_role": "kv_both"}'], "kv_role"),
        (_with_extra(notify_port="x"), "not an integer"),
        (["m", "-tp", "0"], "at least 1"),
        (["m", "--time-scale", "0"], "positive"),
        (["m", "--sim-prefill-error", "200"], "HTTP error status"),
    ],
)
def test_bad_command_lines_are_clear_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv, env={})


def test_bad_environment_knob_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="PD_SIM_CRASH_AFTER"):
        parse_args(["m"], env={"PD_SIM_CRASH_AFTER": "many"})


def test_the_api_key_comes_from_the_flag_else_from_vllms_variable() -> None:
    assert parse_args(["m"], env={}).api_keys == ()
    assert parse_args(["m"], env={"VLLM_API_KEY": "e"}).api_keys == ("e",)
    assert parse_args(["m", "--api-key", "a", "b"], env={"VLLM_API_KEY": "e"}).api_keys == ("a", "b")
