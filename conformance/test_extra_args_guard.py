"""The extraArgs guard reads flags as vLLM's own parser does (tests/operator/flag_spellings.py).

A word the guard refuses sets the guarded destination in vLLM exactly as the flag's canonical spelling
does (or vLLM refuses it too); a word it takes leaves every guarded destination as rendered; and over
every option `vllm serve` defines, the guard names exactly the ones whose destination it guards. A
``--config`` file is the exception to "as its canonical spelling": vLLM reads the file for the exact
word only, and what it reads sets any flag, so every spelling is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.rendered import EngineCase, example_cases
from conformance.vllm_code import ServeArgsRejected, serve_namespace, serve_option_dests
from pd_operator.vllm_flags import COMPILATION_CONFIG_FLAGS, MANAGED_FLAGS, names_flag
from tests.operator.flag_spellings import ACCEPTED, COMPILATION_CONFIG, REFUSED

DESTS = serve_option_dests()
GUARDED = {DESTS[flag] for flag in MANAGED_FLAGS}
REFUSED_BY_VLLM = "refused by vllm serve"
BY_CONFIG = ("--config", "serve.yaml")


def _base() -> EngineCase:
    """A rendered prefill engine: every guarded flag but --data-parallel-size and --served-model-name set."""
    return next(c for c in example_cases() if c.name == "qwen3-235b-write/prefill")


BASE = _base()


def outcome(words: tuple[str, ...], dest: str) -> Any:
    """What ``vllm serve`` with the rendered arguments and ``words`` appended sets ``dest`` to."""
    try:
        value = getattr(serve_namespace([*BASE.serve_args, *words]), dest)
    except ServeArgsRejected:
        return REFUSED_BY_VLLM
    if hasattr(value, "engine_id"):  # a KVTransferConfig: its engine_id is a fresh random id each parse
        return {key: v for key, v in vars(value).items() if key != "engine_id"}
    return value


def test_the_guarded_destinations_are_the_flags_of_the_managed_table() -> None:
    rendered = {"port", "tensor_parallel_size", "data_parallel_size", "kv_transfer_config", "served_model_name"}
    listening = {"host", "uds", "api_key", "data_parallel_address", "data_parallel_rpc_port", "kv_events_config"}
    layout = {"headless", "api_server_count", "data_parallel_size_local", "data_parallel_start_rank", "nnodes"}
    layout |= {"data_parallel_rank", "data_parallel_hybrid_lb", "data_parallel_external_lb", "node_rank"}
    layout |= {"data_parallel_multi_port_external_lb", "data_parallel_supervisor_port", "data_parallel_backend"}
    gpus = {"pipeline_parallel_size", "prefill_context_parallel_size", "device_ids", "distributed_executor_backend"}
    assert rendered | listening | layout | gpus | {"config"} == GUARDED


def test_every_spelling_vllm_defines_for_a_guarded_destination_is_in_the_table() -> None:
    assert {option for option, dest in DESTS.items() if dest in GUARDED} == set(MANAGED_FLAGS)


READ_AS_A_FLAG = [words for words, canonical in REFUSED.items() if canonical is None or canonical[0] != "--config"]


@pytest.mark.parametrize("words", READ_AS_A_FLAG, ids=" ".join)
def test_each_word_the_guard_refuses_sets_a_guarded_destination_in_vllm(words: tuple[str, ...]) -> None:
    canonical = REFUSED[words]
    if canonical is None:  # an ambiguous prefix: vLLM refuses it too
        assert outcome(words, "port") == REFUSED_BY_VLLM
        return
    dest = DESTS[canonical[0]]
    assert outcome(canonical, dest) != outcome((), dest), f"{canonical} does not change {dest}"
    if _ambiguous_here(words[0]):  # a newer release's flag shares the prefix: vLLM refuses it as the guard does
        assert outcome(words, dest) == REFUSED_BY_VLLM
        return
    assert outcome(words, dest) == outcome(canonical, dest)


def _ambiguous_here(word: str) -> bool:
    """Whether ``word`` abbreviates more than one option of this release's parser (0.34 added the hidden
    ``--headless-client-handshake-address``, so ``--headl`` no longer means ``--headless`` alone)."""
    option = word.split("=", 1)[0]
    return word.startswith("--") and option not in DESTS and len({o for o in DESTS if o.startswith(option)}) > 1


def test_a_config_file_sets_managed_flags_past_any_guard_on_words(tmp_path: Path, monkeypatch: Any) -> None:
    """The file's flags come before the command line's, so it sets any flag the operator does not render."""
    (tmp_path / "serve.yaml").write_text("uds: /tmp/engine.sock\ndata-parallel-size-local: 2\n")
    monkeypatch.chdir(tmp_path)
    assert outcome(BY_CONFIG, "uds") == "/tmp/engine.sock" != outcome((), "uds")
    assert outcome(BY_CONFIG, "data_parallel_size_local") == 2
    assert outcome(("--config=serve.yaml",), "config") == "serve.yaml"  # only the exact word reads the file
    assert all(names_flag(words[0], MANAGED_FLAGS) for words, canonical in REFUSED.items() if canonical == BY_CONFIG)


@pytest.mark.parametrize("words", ACCEPTED, ids=" ".join)
def test_each_word_the_guard_takes_leaves_the_guarded_destinations_alone(words: tuple[str, ...]) -> None:
    for dest in sorted(GUARDED):
        assert outcome(words, dest) == outcome((), dest) != REFUSED_BY_VLLM, dest


def test_over_every_vllm_option_the_guard_names_exactly_the_guarded_ones() -> None:
    named = {option for option in DESTS if names_flag(option, MANAGED_FLAGS)}
    assert named == {option for option, dest in DESTS.items() if dest in GUARDED}


def test_over_every_vllm_option_a_compilation_config_is_exactly_its_own() -> None:
    named = {option for option in DESTS if names_flag(option, COMPILATION_CONFIG_FLAGS)}
    assert named == {option for option, dest in DESTS.items() if dest == "compilation_config"}


@pytest.mark.parametrize("words", COMPILATION_CONFIG, ids=" ".join)
def test_each_compilation_config_spelling_sets_it_in_vllm(words: tuple[str, ...]) -> None:
    assert outcome(words, "compilation_config") != outcome((), "compilation_config") != REFUSED_BY_VLLM
