"""Pure: what the operator knows about `vllm serve`'s command line, in Python and in CEL.

How vLLM's parser (FlexibleArgumentParser, an argparse.ArgumentParser) reads a word of the command line,
which is what a guard on extraArgs must match, not the spelling we render: the option name ends at the
first "=" (``--port=9000``) or "." (``--kv-transfer-config.kv_role=kv_producer`` sets the whole
--kv-transfer-config from its dotted keys); underscores in it are dashes (``--tensor_parallel-size``);
argparse takes any prefix of an option (``--tensor-par``, ``-t`` for -tp) as that option when only
one option starts with it, and a one-letter option with its value attached (``-n2`` is ``-n 2``). A prefix
shared with another option is refused by argparse as ambiguous, so counting every prefix as the flag
refuses nothing vLLM would have accepted as another option (conformance/test_extra_args_guard.py checks
this against every option of vLLM's `vllm serve`).

The command lines (command_lines.py) and the API's rules on extraArgs (api/) both read this module,
which sits below them: the command lines import the API, so the facts cannot live in either.
"""

from __future__ import annotations

from collections.abc import Sequence

from pd_operator.rules import cel_list

# The flags extraArgs must not name: those the operator renders, and those that change what it counts on
# (where an engine listens, which processes it runs, how many GPUs it uses). Every option string vLLM 0.31
# defines for each (long, short, --no-), so every spelling is caught; docs/security.md says why each.
MANAGED_FLAGS = (
    # rendered from the spec's fields
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--data-parallel-size",
    "-dp",
    "--kv-transfer-config",
    "--served-model-name",
    "--distributed-executor-backend",  # mp: the engine's workers are processes of this pod
    # where an engine listens, and with what key: the proxy and the probes dial the port the operator gave it
    "--host",  # 127.0.0.1 with hostNetwork: another address opens the engine to the node's network
    "--uds",  # a Unix socket instead: nothing of the engine's listens on its port, so a neighbour may
    "--api-key",  # the engines' key, which the operator gives the proxy
    "--data-parallel-address",  # the data-parallel coordinator's address and port
    "-dpa",
    "--data-parallel-rpc-port",
    "-dpp",
    "--data-parallel-supervisor-port",  # the multi-port external-LB supervisor's HTTP port
    "--kv-events-config",  # a ZMQ publisher, tcp://*:5557 by default: a port on every address, no key
    # the process layout: one API server in front of the engine's data-parallel ranks, all on this node
    "--headless",
    "--api-server-count",
    "-asc",
    "--data-parallel-size-local",
    "-dpl",
    "--data-parallel-start-rank",
    "-dpr",
    "--data-parallel-rank",
    "-dpn",
    "--data-parallel-hybrid-lb",
    "--no-data-parallel-hybrid-lb",
    "-dph",
    "--data-parallel-external-lb",
    "--no-data-parallel-external-lb",
    "-dpe",
    "--data-parallel-multi-port-external-lb",
    "-dpm",
    "--data-parallel-backend",
    "-dpb",
    "--nnodes",
    "-n",
    "--node-rank",
    "-r",
    # the GPU arithmetic: gpus = tensorParallelSize * dataParallelSize, and each rank's KV ports from it
    "--pipeline-parallel-size",
    "-pp",
    "--prefill-context-parallel-size",
    "-pcp",
    "--device-ids",
    # more flags, from a file this guard cannot read
    "--config",
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


def _one_letter(spellings: Sequence[str]) -> list[str]:
    """The one-letter options (``-n``) among ``spellings``: argparse reads ``-n2`` as ``-n 2``."""
    return [s for s in spellings if len(s) == 2 and s[0] == "-" and s[1] != "-"]


def names_flag(word: str, spellings: Sequence[str]) -> bool:
    """Whether vLLM's parser could read ``word`` as one of ``spellings`` (canonical, dashed option names)."""
    key = flag_key(word)
    as_prefix = len(key) >= 2 and key != "--" and any(spelling.startswith(key) for spelling in spellings)
    return as_prefix or any(word.startswith(letter) for letter in _one_letter(spellings))


def cel_names_flag(word: str, spellings: Sequence[str]) -> str:
    """CEL of :func:`names_flag` for the string at ``word``.

    The key is computed once, in a one-element list literal (CEL has no let on every API server version).
    """
    key = cel_flag_key(word)
    as_prefix = f"[{key}].exists(k, k.size() >= 2 && k != '--' && {_cel_prefix_of_any('k', sorted(spellings))})"
    letters = _one_letter(spellings)
    return f"({as_prefix} || {cel_list(letters)}.exists(s, {word}.startsWith(s)))" if letters else as_prefix


# Spellings a prefix is compared with at once; more are first told apart by what the key starts with.
_CEL_LEAF = 8


def _common_prefix(words: Sequence[str]) -> str:
    """What every word starts with (that of the first and last in sort order is that of all)."""
    first, last = min(words), max(words)
    return first[: next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first))]


def _cel_prefix_of_any(key: str, spellings: list[str]) -> str:
    """CEL: the string at ``key`` is a prefix of one of ``spellings``.

    The API server's cost estimate of ``s.startsWith(key)`` grows with the largest key (a 4 KiB word), so
    a flat list of every managed spelling is over its budget (1.14 times it on
    spec.colocated.engines[].extraArgs[], Kubernetes 1.36). Instead the spellings sharing a prefix P are
    compared only when the key starts with P (a cheap test: P is a constant); otherwise the key may
    still be a prefix of P itself, so P stands in for them. A conditional costs its costlier branch: the
    whole rule then costs 0.38 of the budget there.
    """
    common = _common_prefix(spellings)
    groups: dict[str, list[str]] = {}
    for spelling in spellings:
        if len(spelling) > len(common):
            groups.setdefault(common + spelling[len(common)], []).append(spelling)
    prefix, group = max(groups.items(), key=lambda item: len(item[1]), default=("", []))
    if len(spellings) <= _CEL_LEAF or len(group) < 2:
        return f"{cel_list(spellings)}.exists(s, s.startsWith({key}))"
    rest = [s for s in spellings if s not in group] + [prefix]
    inside, outside = _cel_prefix_of_any(key, group), _cel_prefix_of_any(key, rest)
    return f"({key}.startsWith('{prefix}') ? {inside} : {outside})"


def sets_compilation_config(args: Sequence[str]) -> bool:
    """Whether ``vllm serve`` arguments set a compilation config in any spelling vLLM accepts."""
    return any(names_flag(a, COMPILATION_CONFIG_FLAGS) for a in args)


def cel_sets_compilation_config(args: str) -> str:
    """CEL of :func:`sets_compilation_config` for the list of strings at ``args``."""
    return f"{args}.exists(a, {cel_names_flag('a', COMPILATION_CONFIG_FLAGS)})"
