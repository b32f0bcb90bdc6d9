"""`pdctl`: one console script, one subcommand per tool.

Each subcommand lives in its own module, which exposes ``main(argv: list[str]) -> int`` and owns its
argument parser (prog ``pdctl <name>``). Modules are imported only when their subcommand runs, so
`pdctl proxy` never pays for importing kopf and `pdctl operator` never imports ZMQ; this is also the only
place the runtime reaches the operator package, by module name (the layer contracts in pyproject.toml).

Each subcommand names the pip extra its imports need (README, "Install"). When a third-party module
is missing, pdctl says in one line which extra to install instead of showing a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple

EXIT_MISSING_EXTRA = 1


class Subcommand(NamedTuple):
    module: str
    summary: str
    extra: str | None
    """The extra its imports need; None: the base install (`pip install pd-operator`)."""


SUBCOMMANDS: dict[str, Subcommand] = {
    "operator": Subcommand(
        "pd_operator.commands.operator", "run the kopf operator that reconciles PDDeployments", "operator"
    ),
    "crd": Subcommand("pd_operator.commands.crd", "print the PDDeployment CustomResourceDefinition", "api"),
    "render": Subcommand(
        "pd_operator.commands.render", "print every object the operator would create for a file", "api"
    ),
    "autotune": Subcommand(
        "pd_operator.commands.autotune", "pin a PDDeployment's tuned layout into its spec (accept NAME)", "operator"
    ),
    "proxy": Subcommand("pd_runtime.proxy.cli", "run the MoRI-IO prefill/decode proxy", "proxy"),
    "sim-engine": Subcommand(
        "pd_runtime.sim.cli", "run a simulated vLLM engine (MoRI-IO protocol, timing model)", "sim"
    ),
    "bench": Subcommand("pd_runtime.bench.cli", "open-loop goodput benchmark against an OpenAI endpoint", None),
    "plan": Subcommand(
        "pd_runtime.plan.cli", "rank the node's layouts for a workload with the simulator: disaggregate or not", None
    ),
    "engine": Subcommand("pd_runtime.launcher", "preflight checks, then exec the engine command after --", None),
    "wait-proxy-gone": Subcommand(
        "pd_runtime.wait_proxy_gone", "the engines' preStop hook: wait until the pod's proxy has drained", None
    ),
}

OPTIONAL_MODULES: dict[str, str] = {"matplotlib": "plot", "uvloop": "fast", "opentelemetry": "tracing"}
"""Third-party modules that only an option imports (`bench --plot`, `proxy --loop uvloop`,
`proxy --otlp-traces-endpoint`), by extra."""


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: pdctl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {sub.summary}" for name, sub in SUBCOMMANDS.items()]
    lines += ["", "Run 'pdctl <command> --help' for a command's options."]
    return "\n".join(lines)


def missing_extra(sub: Subcommand, exc: ModuleNotFoundError) -> tuple[str, str] | None:
    """(the missing top-level module, the extra that provides it), or None when no extra would (a bug)."""
    top = (exc.name or "").partition(".")[0]
    if not top or top.startswith("pd_"):
        return None
    extra = OPTIONAL_MODULES.get(top, sub.extra)
    return None if extra is None else (top, extra)


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
    try:
        module = importlib.import_module(sub.module)
        code: int = module.main(rest)
    except ModuleNotFoundError as exc:
        missing = missing_extra(sub, exc)
        if missing is None:
            raise
        absent, extra = missing
        sys.stderr.write(
            f"pdctl {name}: needs the '{extra}' extra ({absent} is not installed): pip install 'pd-operator[{extra}]'\n"
        )
        return EXIT_MISSING_EXTRA
    return code


if __name__ == "__main__":
    sys.exit(main())
