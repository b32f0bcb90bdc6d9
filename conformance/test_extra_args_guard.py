"""The extraArgs guard reads flags as vLLM's own parser does (tests/operator/flag_spellings.py).

A word the guard refuses sets the guarded destination in vLLM exactly as the flag's canonical spelling
does (or vLLM refuses it too); a word it takes leaves every guarded destination as rendered; and over
every option `vllm serve` defines, the guard names exactly the ones whose destination it guards.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.rendered import EngineCase, example_cases
from conformance.vllm_code import ServeArgsRejected, serve_namespace, serve_option_dests
from pd_operator.vllm_flags import COMPILATION_CONFIG_FLAGS, MANAGED_FLAGS, names_flag
from tests.operator.flag_spellings import ACCEPTED, COMPILATION_CONFIG, REFUSED

DESTS = serve_option_dests()
GUARDED = {DESTS[flag] for flag in MANAGED_FLAGS}
REFUSED_BY_VLLM = "refused by vllm serve"


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


def test_the_guarded_destinations_are_the_flags_the_operator_renders() -> None:
    assert {"port", "tensor_parallel_size", "data_parallel_size", "kv_transfer_config", "served_model_name"} == GUARDED


@pytest.mark.parametrize("words", list(REFUSED), ids=" ".join)
def test_each_word_the_guard_refuses_sets_a_guarded_destination_in_vllm(words: tuple[str, ...]) -> None:
    canonical = REFUSED[words]
    if canonical is None:  # an ambiguous prefix: vLLM refuses it too
        assert outcome(words, "port") == REFUSED_BY_VLLM
        return
    dest = DESTS[canonical[0]]
    assert outcome(canonical, dest) != outcome((), dest), f"{canonical} does not change {dest}"
    assert outcome(words, dest) == outcome(canonical, dest)


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
