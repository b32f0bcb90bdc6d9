"""`pdctl`: one console script, one subcommand per tool.

Each subcommand lives in its own module, which exposes ``main(argv: list[str]) -> int`` and owns its
argument parser (prog ``pdctl <name>``). Modules are imported only when their subcommand runs, so
`pdctl proxy` never pays for importing kopf and `pdctl operator` never imports ZMQ.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "operator": Subcommand("pd_operator.commands.operator", "run the kopf operator that reconciles PDDeployments"),
    "crd": Subcommand("pd_operator.commands.crd", "print the PDDeployment CustomResourceDefinition"),
    "render": Subcommand("pd_operator.commands.render", "print every object the operator would create for a file"),
    "proxy": Subcommand("pd_runtime.proxy.cli", "run the MoRI-IO prefill/decode proxy"),
    "sim-engine": Subcommand("pd_runtime.sim.cli", "run a simulated vLLM engine (MoRI-IO protocol, timing model)"),
    "bench": Subcommand("pd_runtime.bench.cli", "open-loop goodput benchmark against an OpenAI endpoint"),
    "engine": Subcommand("pd_runtime.launcher", "preflight checks, then exec the engine command after --"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: pdctl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {sub.summary}" for name, sub in SUBCOMMANDS.items()]
    lines += ["", "Run 'pdctl <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(_usage() + "\n")
        return 0
    name, rest = args[0], args[1:]
    sub = SUBCOMMANDS.get(name)
    if sub is None:
        sys.stderr.write(f"pdctl: unknown command {name!r}\n\n{_usage()}\n")
        return 2
    module = importlib.import_module(sub.module)
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())
