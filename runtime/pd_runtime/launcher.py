"""`pdctl engine`: preflight checks, then exec the engine command given after `--`.

The operator puts the complete engine command after `--` in the container spec, so `kubectl get pod -o
yaml` shows exactly what runs. The launcher checks first that the container got what that command needs
(GPUs, partition mode, /dev/shm, RDMA devices, free ports). A failed check writes its reason to the
termination message, which the operator copies into the PDDeployment's status, and exits 78 (EX_CONFIG)
so the cause is visible without reading logs. On success the launcher replaces itself with the engine
(exec), so signals and the exit code are the engine's own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import cast

from pd_runtime import aiter_cache, hostfacts
from pd_runtime.argtypes import non_negative_int
from pd_runtime.preflight import Backend, EngineNeeds, Role, effective_min_shm_mib, failure_message, preflight

logger = logging.getLogger(__name__)

EXIT_PREFLIGHT_FAILED = 78  # sysexits.h EX_CONFIG
EXIT_COMMAND_NOT_EXECUTABLE = 126  # the shell's conventions
EXIT_COMMAND_NOT_FOUND = 127
TERMINATION_LOG_ENV = "PD_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"


def _ports(text: str) -> tuple[int, ...]:
    try:
        ports = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated port numbers, got {text!r}") from None
    if not all(1 <= port <= 65535 for port in ports):
        raise argparse.ArgumentTypeError(f"ports must be within 1..65535, got {text!r}")
    return ports


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl engine",
        description="Check that this container has what the engine needs, then exec the command after --.",
        epilog="Example: pdctl engine --role prefill --gpus 4 --backend rdma --ports 20005,6301,6105 "
        "-- vllm serve MODEL ...  A failed check exits 78 with its reason in the termination message "
        f"(${TERMINATION_LOG_ENV}, default {DEFAULT_TERMINATION_LOG}).",
    )
    parser.add_argument("--role", choices=["prefill", "decode", "engine"], required=True)
    parser.add_argument("--gpus", type=non_negative_int, required=True, help="GPUs the engine uses; 0 skips GPU checks")
    parser.add_argument(
        "--backend",
        choices=["rdma", "xgmi", "none"],
        default="none",
        help="KV transfer backend; rdma requires RDMA devices, none skips the check",
    )
    parser.add_argument("--ports", type=_ports, default=(), help="ports the engine will listen on (must be free)")
    parser.add_argument(
        "--min-shm-mib",
        type=non_negative_int,
        default=None,
        help="minimum /dev/shm size (default: 1024 when --gpus > 1, else no check)",
    )
    parser.add_argument(
        "--vllm-version",
        default=None,
        help="the vLLM release the engine must run (the spec's engineVersion); refused when the command "
        "runs another (the installed vllm distribution's version, or the simulated engine's); unset: no check",
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="print the observed facts and problems as JSON and exit (0 or 78); exec nothing",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the engine command and its arguments")
    return parser


def parse(argv: Sequence[str]) -> tuple[EngineNeeds, list[str], bool]:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command and not args.check_only:
        parser.error("missing the engine command: add -- and the command to exec")
    needs = EngineNeeds(
        role=cast(Role, args.role),
        gpus=args.gpus,
        backend=cast(Backend, args.backend),
        ports=args.ports,
        min_shm_mib=effective_min_shm_mib(args.gpus, args.min_shm_mib),
        vllm_version=args.vllm_version,
    )
    return needs, command, bool(args.check_only)


def write_termination_message(message: str) -> None:
    path = Path(os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG))
    try:
        path.write_text(message)
    except OSError as error:
        logger.warning("cannot write the termination message to %s: %s", path, error)


def fail(message: str, code: int) -> int:
    sys.stderr.write(message if message.endswith("\n") else message + "\n")
    write_termination_message(message)
    return code


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    needs, command, check_only = parse(argv)
    facts = hostfacts.gather(needs.ports, os.environ, command=command)
    problems = preflight(needs, facts)
    if check_only:
        report = {"ok": not problems, "needs": asdict(needs), "problems": problems, "facts": asdict(facts)}
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
        return EXIT_PREFLIGHT_FAILED if problems else 0
    if problems:
        return fail(failure_message(needs, problems), EXIT_PREFLIGHT_FAILED)
    aiter_cache.prepare(os.environ)
    logger.info(
        "preflight passed for the %s engine (%d GPU(s), backend %s, vLLM %s); exec %s",
        needs.role,
        needs.gpus,
        needs.backend,
        facts.engine_version or f"unknown: {facts.engine_version_source}",
        command[0],
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as error:
        code = EXIT_COMMAND_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_COMMAND_NOT_EXECUTABLE
        return fail(f"pdctl engine: cannot exec {command[0]!r}: {error.strerror}", code)
