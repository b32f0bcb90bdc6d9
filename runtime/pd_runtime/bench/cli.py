"""`pdctl bench`: parse flags, run the stages, write the table, the JSON documents and the plot.

Exit codes: 0 the run completed (whatever the attainment); 1 the run itself failed (e.g. an output
file could not be written); 2 bad arguments; 3 attainment at --rate below --target, only with
--fail-below-target; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp

from pd_runtime import eventloop
from pd_runtime.argtypes import fraction, non_negative_int, positive_float, positive_int
from pd_runtime.bench.client import BenchClient, ClientConfig
from pd_runtime.bench.curves import Curve, curve_from_document, load_curves
from pd_runtime.bench.plan import Mode, RunResult, Workload
from pd_runtime.bench.progress import progress_factory
from pd_runtime.bench.report import render_table
from pd_runtime.bench.report_html import render_bench
from pd_runtime.bench.result import RunContext, full_result, summary_json
from pd_runtime.bench.runner import Runner
from pd_runtime.bench.search import SearchParams, parse_sweep
from pd_runtime.bench.slo import Slo
from pd_runtime.openai_api import Endpoint, endpoint_url
from pd_runtime.report_page import package_version
from pd_runtime.workload.arrivals import Arrival

log = logging.getLogger(__name__)

API_KEY_ENV = ("PDCTL_BENCH_API_KEY", "OPENAI_API_KEY")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BELOW_TARGET, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl bench",
        description="Open-loop SLO-attainment and goodput benchmark against an OpenAI-compatible endpoint "
        "(docs/goodput.md).",
    )
    target = parser.add_argument_group("target")
    target.add_argument("--url", help="server root, its /v1, or the full endpoint URL")
    target.add_argument("--model", help="model name sent in every request")
    target.add_argument(
        "--endpoint",
        choices=[e.value for e in Endpoint],
        default=Endpoint.COMPLETIONS.value,
        help="completions sends token-id prompts of exact length (default); chat sends text",
    )
    target.add_argument(
        "--api-key", default=None, help=f"bearer token (default: ${API_KEY_ENV[0]} or ${API_KEY_ENV[1]})"
    )
    target.add_argument(
        "--timeout-s",
        type=positive_float,
        default=300.0,
        help="a request not complete after this many seconds fails as a timeout (default 300)",
    )

    load = parser.add_argument_group("load")
    load.add_argument("--rate", type=positive_float, help="request rate (req/s); the search starts here")
    load.add_argument("--requests", type=positive_int, default=100, help="measured requests per rate (default 100)")
    load.add_argument(
        "--warmup",
        type=non_negative_int,
        default=0,
        help="extra requests sent first at each rate and left out of every figure (default 0)",
    )
    load.add_argument("--prompt-tokens", type=positive_int, default=2000)
    load.add_argument("--output-tokens", type=positive_int, default=1000)
    load.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let replies end at EOS (at most --output-tokens each), as in workloads of natural replies; "
        "by default every reply has exactly --output-tokens tokens",
    )
    load.add_argument("--arrival", choices=[a.value for a in Arrival], default=Arrival.POISSON.value)
    load.add_argument("--seed", type=int, default=0, help="seed for arrivals and prompts (default 0)")
    modes = load.add_mutually_exclusive_group()
    modes.add_argument("--sweep", metavar="FROM:TO:STEP", help="measure every rate FROM..TO (e.g. 0.5:10:0.5)")
    modes.add_argument(
        "--search",
        action="store_true",
        help="find the highest rate whose attainment reaches --target (bracket, then bisect)",
    )
    load.add_argument(
        "--search-tolerance",
        type=positive_float,
        default=0.05,
        help="stop the search when the bracket is within this fraction of the rate (default 0.05)",
    )

    slo = parser.add_argument_group("SLO")
    slo.add_argument("--slo-ttft-ms", type=positive_float, default=1000.0)
    slo.add_argument("--slo-itl-ms", type=positive_float, default=50.0)
    slo.add_argument("--target", type=fraction, default=0.9, help="attainment target, a fraction (default 0.9)")
    slo.add_argument(
        "--fail-below-target",
        action="store_true",
        help=f"exit {EXIT_BELOW_TARGET} when attainment at --rate is below --target",
    )

    out = parser.add_argument_group("output")
    out.add_argument("--output", metavar="FILE.json", help="full result with per-request records ('-' = stdout)")
    out.add_argument("--result-file", metavar="PATH", help="compact summary (< 4 KiB), e.g. /dev/termination-log")
    out.add_argument(
        "--plot",
        nargs="+",
        metavar=("FILE.png", "RESULTS.json"),
        help="draw attainment vs rate for this run (if --url is given) and each RESULTS.json",
    )
    out.add_argument("--report", metavar="FILE.html", help="a self-contained HTML page of the run")
    out.add_argument("--label", help="name of this configuration in plots (default: the model)")
    out.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    out.add_argument("--verbose", action="store_true", help="log each stage")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
        _check_combinations(parser, args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.url is None:
            return _plot_only(args)
        return _run_and_report(args)
    except KeyboardInterrupt:
        sys.stderr.write("pdctl bench: interrupted\n")
        return EXIT_INTERRUPTED
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"pdctl bench: {exc}\n")
        return EXIT_FAILED


def _check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url is None:
        if not args.plot:
            parser.error("--url is required (or --plot FILE.png RESULTS.json ... to plot saved results)")
        if len(args.plot) < 2:
            parser.error("--plot without --url needs FILE.png and at least one RESULTS.json")
        return
    if args.model is None or args.rate is None:
        parser.error("--model and --rate are required with --url")
    if args.sweep is not None:
        try:
            parse_sweep(args.sweep)
        except ValueError as exc:
            parser.error(str(exc))


def _run_and_report(args: argparse.Namespace) -> int:
    workload = Workload(
        model=args.model,
        endpoint=Endpoint(args.endpoint),
        requests=args.requests,
        warmup=args.warmup,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        arrival=Arrival(args.arrival),
        seed=args.seed,
        slo=Slo(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms, target=args.target),
        ignore_eos=args.ignore_eos,
    )
    url = endpoint_url(args.url, workload.endpoint)
    # Read the other results to plot and load the plotter before a long run, so either fails at once.
    other_curves = load_curves([Path(p) for p in args.plot[1:]]) if args.plot else []
    draw = _plotter() if args.plot else None
    _raise_open_file_limit()
    run = eventloop.run(_run(args, workload, url))
    client = f"aiohttp {aiohttp.__version__} on {eventloop.loop_name()}"
    context = RunContext(url=url, timeout_s=args.timeout_s, label=args.label, client=client)
    document = full_result(run, workload, context)
    _write_outputs(args, run, workload, document)
    if draw is not None:
        draw([curve_from_document(document, args.label or workload.model), *other_curves], Path(args.plot[0]))
    headline = run.stages[run.headline]
    if args.fail_below_target and not headline.passes(workload.slo.target):
        return EXIT_BELOW_TARGET
    return EXIT_OK


async def _run(args: argparse.Namespace, workload: Workload, url: str) -> RunResult:
    api_key = args.api_key or next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)
    config = ClientConfig(url=url, endpoint=workload.endpoint, timeout_s=args.timeout_s, api_key=api_key)
    progress = progress_factory(sys.stderr, enabled=sys.stderr.isatty() and not args.quiet)
    mode = Mode.SEARCH if args.search else Mode.SWEEP if args.sweep else Mode.RATE
    search = SearchParams(start_rate=args.rate, target=args.target, rel_tolerance=args.search_tolerance)
    async with BenchClient(config) as client:
        runner = Runner(client, workload, progress)
        sweep = parse_sweep(args.sweep) if args.sweep else []
        return await runner.run(mode, args.rate, sweep=sweep, search=search)


def _write_outputs(args: argparse.Namespace, run: RunResult, workload: Workload, document: dict[str, object]) -> None:
    if args.result_file:
        _write_text(Path(args.result_file), summary_json(run, workload))
    if args.output == "-":
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    elif args.output:
        _write_text(Path(args.output), json.dumps(document, indent=1) + "\n")
    if args.report:
        _write_text(Path(args.report), render_bench(run, workload, document, {"pd-operator": package_version()}))
    if not args.quiet and args.output != "-":
        sys.stdout.write(render_table(run, workload))


def _plot_only(args: argparse.Namespace) -> int:
    curves = load_curves([Path(p) for p in args.plot[1:]])
    _plotter()(curves, Path(args.plot[0]))
    return EXIT_OK


def _plotter() -> Callable[[Sequence[Curve], Path], None]:
    """The drawing function, imported only for --plot: matplotlib is the `plot` extra, and a probe Job
    or `--help` should not pay for importing it and numpy (some 280 modules). Without the extra this
    raises ModuleNotFoundError, which `pdctl` reports as the extra to install."""
    from pd_runtime.bench.plot import draw

    return draw


def _write_text(path: Path, text: str) -> None:
    """Plain write, no temp file and rename: the path may be /dev/termination-log."""
    with path.open("w") as handle:
        handle.write(text)


def _raise_open_file_limit() -> None:
    """Open-loop load against a slow server keeps one socket per request in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
