"""Every engine command line we render is one vLLM's own `vllm serve` accepts, as we meant it.

Judged by vLLM's parser (ServeSubcommand + FlexibleArgumentParser, then EngineArgs.from_cli_args and the
KVTransferConfig it builds) and by the MoRIIOConnector's own config reading.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from vllm import envs
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common

from conformance.rendered import EngineCase, example_cases, seed_cases, variant_cases
from conformance.vllm_code import (
    VLLM_VERSION,
    ServeArgsRejected,
    connector_is_registered,
    cpu_platform_is_active,
    extra_config_keys_read,
    normalized_flag,
    parse_serve,
    serve_option_dests,
    side_channel_ports,
)
from pd_runtime.vllm_releases import release

VARIANTS, REFUSED = variant_cases()
CASES = example_cases() + seed_cases() + VARIANTS
KV_CASES = [c for c in CASES if "--kv-transfer-config" in c.serve_args]
OPTIONS = set(serve_option_dests())


def rendered_value(case: EngineCase, flag: str) -> str | None:
    args = case.serve_args
    return args[args.index(flag) + 1] if flag in args else None


def rendered_extra_config(case: EngineCase) -> dict[str, object]:
    config: dict[str, object] = json.loads(rendered_value(case, "--kv-transfer-config") or "{}")
    extra = config.get("kv_connector_extra_config", {})
    assert isinstance(extra, dict)
    return extra


def test_vllm_runs_on_its_cpu_platform() -> None:
    assert cpu_platform_is_active(), "VLLM_TARGET_DEVICE=cpu (conftest.py) did not select vLLM's CpuPlatform"


def test_the_cases_cover_what_we_render() -> None:
    names = {c.name for c in CASES}
    for expected in ("qwen3-235b-write/prefill", "qwen3-235b-read/decode", "qwen3-235b-colocated/engine-1"):
        assert expected in names
    assert {"seed/prefill", "seed/decode", "seed/standard-0"} <= names
    assert len(KV_CASES) >= 30 and any("xgmi" in n for n in names) and any("custom-ports" in n for n in names)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_vllm_serve_parses_the_rendered_command_as_meant(case: EngineCase) -> None:
    parsed = parse_serve(case.serve_args)
    engine = parsed.engine
    assert engine.model == case.serve_args[0]
    assert engine.tensor_parallel_size == int(rendered_value(case, "-tp") or 1)
    assert engine.data_parallel_size == int(rendered_value(case, "--data-parallel-size") or 1)
    assert parsed.args.port == int(rendered_value(case, "--port") or 0)
    assert engine.distributed_executor_backend == "mp"
    if "--kv-transfer-config" not in case.serve_args:
        assert parsed.kv_transfer is None
        return
    kv = parsed.kv_transfer
    assert kv is not None and connector_is_registered(kv.kv_connector), kv.kv_connector
    container = case.name.rpartition("/")[2]  # prefill, or prefill-0, prefill-1 with several engines
    role = "kv_producer" if container.partition("-")[0] == "prefill" else "kv_consumer"
    assert kv.kv_role == role and kv.is_kv_producer == (role == "kv_producer")
    assert kv.kv_connector_extra_config == rendered_extra_config(case)
    assert int(kv.kv_connector_extra_config["http_port"]) == parsed.args.port


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_flag_is_spelt_as_vllm_defines_it(case: EngineCase) -> None:
    """Stricter than argparse, which also takes unambiguous prefixes (``--max_num_seq``) today."""
    flags = [w for w in case.serve_args if w.startswith("-") and not w.lstrip("-").isdigit()]
    unknown = [f for f in flags if normalized_flag(f) not in OPTIONS]
    assert not unknown, f"not an option of vllm serve: {unknown}"


@pytest.mark.parametrize("case", KV_CASES, ids=str)
def test_every_extra_config_key_is_one_the_connector_reads(case: EngineCase, monkeypatch: pytest.MonkeyPatch) -> None:
    read = extra_config_keys_read(parse_serve(case.serve_args), monkeypatch)
    ignored = set(rendered_extra_config(case)) - read
    assert not ignored, f"MoRIIOConnector never reads {sorted(ignored)} (it reads {sorted(read)})"


@pytest.mark.parametrize("case", KV_CASES, ids=str)
def test_no_two_ranks_bind_the_same_side_channel_port(case: EngineCase, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = side_channel_ports(parse_serve(case.serve_args), monkeypatch)
    for kind, index in (("handshake", 0), ("notify", 1)):
        owners: dict[int, list[tuple[int, int]]] = {}
        for rank, pair in ports.items():
            owners.setdefault(pair[index], []).append(rank)
        clashes = {port: ranks for port, ranks in owners.items() if len(ranks) > 1}
        assert not clashes, f"{kind} port clash, port -> (dp_rank, tp_rank): {clashes}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_vllm_environment_variable_is_one_vllm_knows(case: EngineCase) -> None:
    known = set(envs.environment_variables) | set(moriio_common._DEPRECATED_ENV_VARS)
    unknown = [name for name in case.env if name.startswith("VLLM_") and name not in known]
    assert not unknown, unknown


# ---- the checks above can fail: each is broken on purpose once ---------------------------------------


def _a_kv_case() -> EngineCase:
    return next(c for c in KV_CASES if c.name == "qwen3-235b-write/decode")


def test_a_misspelt_flag_is_rejected_by_vllm() -> None:
    case = _a_kv_case()
    misspelt = [w.replace("--max_num_seqs", "--max_num_seqz") for w in case.serve_args]
    with pytest.raises(ServeArgsRejected, match="unrecognized arguments: --max-num-seqz"):
        parse_serve(misspelt)


def test_a_flag_abbreviation_is_caught_even_where_argparse_takes_it() -> None:
    case = _a_kv_case()
    abbreviated = [w.replace("--max_num_seqs", "--max_num_seq") for w in case.serve_args]
    parse_serve(abbreviated)  # argparse accepts the prefix ...
    broken = EngineCase("abbreviated", abbreviated)
    with pytest.raises(AssertionError, match="--max_num_seq'"):
        test_every_flag_is_spelt_as_vllm_defines_it(broken)  # ... our spelling check does not


def test_an_extra_config_key_the_connector_ignores_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _a_kv_case()
    config = json.loads(rendered_value(case, "--kv-transfer-config") or "{}")
    config["kv_connector_extra_config"]["defer_timeout_seconds"] = 60
    args = list(case.serve_args)
    args[args.index("--kv-transfer-config") + 1] = json.dumps(config)
    with pytest.raises(AssertionError, match="never reads \\['defer_timeout_seconds'\\]"):
        test_every_extra_config_key_is_one_the_connector_reads(EngineCase("stray-key", args), monkeypatch)


def test_the_release_table_holds_this_releases_kv_transfer_config_fields() -> None:
    """pd_runtime.vllm_releases (what the operator renders per release) against this vLLM's own config."""
    assert release(VLLM_VERSION).kv_transfer_config_fields == {f.name for f in dataclasses.fields(KVTransferConfig)}


def test_a_field_this_release_does_not_have_is_refused_by_it() -> None:
    """KVTransferConfig forbids unknown fields: a key the table leaves out would fail the engine at start."""
    gone = release("0.31.0").kv_transfer_config_fields - release(VLLM_VERSION).kv_transfer_config_fields
    for name in gone | {"no_such_field"}:
        with pytest.raises(ValueError, match=name):
            KVTransferConfig(**{name: 1})
