"""Pure: what the operator knows about `vllm serve`'s command line, in Python and in CEL.

How vLLM's parser (FlexibleArgumentParser, an argparse.ArgumentParser) reads a word of the command line,
which is what a guard on extraArgs must match, not the spelling we render: the option name ends at the
first "=" (``--port=9000``) or "." (``--kv-transfer-config.kv_role=kv_producer`` sets the whole
--kv-transfer-config from its dotted keys); underscores in it are dashes (``--tensor_parallel-size``);
and argparse takes any prefix of an option (``--tensor-par``, ``-t`` for -tp) as that option when only
one option starts with it. A prefix shared with another option is refused by argparse as ambiguous,
so counting every prefix as the flag refuses nothing vLLM would have accepted as another option
(conformance/test_extra_args_guard.py checks this against every option of vLLM's `vllm serve`).

The command lines (command_lines.py) and the API's rules on extraArgs (api/) both read this module,
which sits below them: the command lines import the API, so the facts cannot live in either.
"""

from __future__ import annotations

from collections.abc import Sequence

from pd_operator.rules import cel_list

# Flags the operator renders itself, by their canonical names; extraArgs setting them would fight it.
MANAGED_FLAGS = (
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--data-parallel-size",
    "-dp",
    "--kv-transfer-config",
    "--served-model-name",
)
# vLLM's compilation config flag (also dotted: -cc.cudagraph_mode=PIECEWISE). A user's compilation config
# replaces the one the operator renders in read mode (command_lines.vllm_serve_args).
COMPILATION_CONFIG_FLAGS = ("--compilation-config", "-cc")


def flag_key(word: str) -> str:
    """The option name vLLM reads in a command-line word: before any "=" and ".", underscores as dashes."""
    return word.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def cel_flag_key(word: str) -> str:
    """CEL of :func:`flag_key` for the string at ``word``."""
    return f"{word}.split('=')[0].split('.')[0].replace('_', '-')"


def names_flag(word: str, spellings: Sequence[str]) -> bool:
    """Whether vLLM's parser could read ``word`` as one of ``spellings`` (canonical, dashed option names)."""
    key = flag_key(word)
    return len(key) >= 2 and key != "--" and any(spelling.startswith(key) for spelling in spellings)


def cel_names_flag(word: str, spellings: Sequence[str]) -> str:
    """CEL of :func:`names_flag` for the string at ``word``.

    The key is computed once, in a one-element list literal (CEL has no let on every API server version).
    """
    key = cel_flag_key(word)
    return f"[{key}].exists(k, k.size() >= 2 && k != '--' && {cel_list(spellings)}.exists(s, s.startsWith(k)))"


def sets_compilation_config(args: Sequence[str]) -> bool:
    """Whether ``vllm serve`` arguments set a compilation config in any spelling vLLM accepts."""
    return any(names_flag(a, COMPILATION_CONFIG_FLAGS) for a in args)


def cel_sets_compilation_config(args: str) -> str:
    """CEL of :func:`sets_compilation_config` for the list of strings at ``args``."""
    return f"{args}.exists(a, {cel_names_flag('a', COMPILATION_CONFIG_FLAGS)})"
