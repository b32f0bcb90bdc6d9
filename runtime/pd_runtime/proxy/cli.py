"""`pdctl proxy`: parse flags into a ProxyConfig, run the server until SIGTERM/SIGINT, drain, exit.

With ``--router`` it runs the router in front of a PDDeployment's replicas instead (proxy/router.py):
``--host`` and ``--port`` are then the router's, ``--admin-port`` the replicas' admin port.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import signal
import typing
from collections.abc import Sequence
from typing import Any

import zmq

from pd_runtime import eventloop
from pd_runtime.proxy import tracing
from pd_runtime.proxy.config import TIMEOUT_SUFFIX, ProxyConfig, Timeouts, flag_fields, flag_name
from pd_runtime.proxy.gate import expected_by_address, parse_expected_engine
from pd_runtime.proxy.logs import configure
from pd_runtime.proxy.registry import static_engine
from pd_runtime.proxy.router import SERVICE_ACCOUNT, RouterConfig
from pd_runtime.proxy.router import serve as serve_router
from pd_runtime.proxy.server import ProxyServer

log = logging.getLogger(__name__)

GC_GEN0_THRESHOLD = 7000
"""Net new container objects between collections of the youngest generation (Python's default: 700)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdctl proxy",
        description="MoRI-IO prefill/decode proxy: OpenAI API in, prefill and decode legs out (docs/proxy.md).",
        # Every flag has one spelling (and --flag=value), so the operator's guard on a PDDeployment's proxy
        # extraArgs (api/serving.py) needs no list of prefixes to see the flags it manages.
        allow_abbrev=False,
    )
    _add_fields(p, ProxyConfig, ProxyConfig(), "")
    _add_fields(p, Timeouts, Timeouts(), TIMEOUT_SUFFIX)
    p.add_argument("--api-key-env", default="PD_PROXY_API_KEY", help="env var with the key clients must send")
    p.add_argument("--engine-api-key-env", default="VLLM_API_KEY", help="env var with the engines' key")
    p.add_argument(
        "--admin-key-env",
        default="PD_PROXY_ADMIN_KEY",
        help="env var with the key the admin port's /status asks for (see --network); the router sends it",
    )
    p.add_argument("--loop", choices=eventloop.LOOP_CHOICES, default="auto", help="auto: uvloop when installed")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    router = p.add_argument_group("router mode (several replicas of a PDDeployment behind one address)")
    router.add_argument("--router", action="store_true", help="balance across the replicas' proxies")
    router.add_argument("--pddeployment", help="discover the ready replicas of this PDDeployment (EndpointSlices)")
    router.add_argument("--namespace", help="its namespace (default: the pod's own)")
    router.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="HOST:PORT[=ADMIN_HOST:ADMIN_PORT]",
        help="a fixed replica proxy (repeat), with its admin address when it is not HOST:--admin-port",
    )
    router.add_argument("--backend-port", type=int, default=8000, help="the replicas' API port")
    return p


def router_config(args: argparse.Namespace, environ: dict[str, str]) -> RouterConfig:
    namespace = args.namespace
    if namespace is None and (SERVICE_ACCOUNT / "namespace").exists():
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
    return RouterConfig(
        port=args.port,
        host=args.host,
        backends=tuple(b.split("=", 1)[0] for b in args.backend),
        admin_addresses=dict(b.split("=", 1) for b in args.backend if "=" in b),
        pddeployment=args.pddeployment,
        namespace=namespace,
        backend_port=args.backend_port,
        admin_port=args.admin_port or 8001,
        admin_key=environ.get(args.admin_key_env) or None,
    )


def _dest(item: dataclasses.Field[Any], suffix: str) -> str:
    return flag_name(item, suffix)[2:].replace("-", "_")


def _add_fields(parser: argparse.ArgumentParser, cls: type, defaults: Any, suffix: str) -> None:
    """One flag per documented field of a settings dataclass, its default and help taken from the field."""
    hints = typing.get_type_hints(cls)
    for item in flag_fields(cls):
        meta = item.metadata
        kind, choices = _flag_type(hints[item.name])
        default = getattr(defaults, item.name)
        shown = "" if default is None else " (default %(default)s)"  # a None default is explained in the help
        kwargs: dict[str, Any] = {"dest": _dest(item, suffix), "help": meta["help"] + shown}
        if choices is None:
            kwargs["metavar"] = meta["metavar"] or ("SECONDS" if suffix else item.name.removesuffix("_s").upper())
        flag = flag_name(item, suffix)
        if kind is tuple:
            parser.add_argument(flag, action="append", default=list(default), **kwargs)
        else:
            parser.add_argument(flag, type=meta["parse"] or kind, choices=choices, default=default, **kwargs)


def _flag_type(hint: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """The argparse type and choices of a field's type: Literal -> choices, ``X | None`` -> X."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return str, tuple(args)
    if typing.get_origin(hint) is tuple:
        return tuple, None
    if args:  # an optional value
        return _flag_type(args[0])
    return hint, None


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> ProxyConfig:
    """The parsed flags as a ProxyConfig; the keys come from the environment variables the flags name."""
    values = vars(args)

    def settings(cls: type, suffix: str) -> dict[str, Any]:
        return {f.name: values[_dest(f, suffix)] for f in flag_fields(cls)}

    top = settings(ProxyConfig, "")
    top["engines"] = tuple(top["engines"])
    top["expected_engines"] = tuple(top["expected_engines"])
    return ProxyConfig(
        **top,
        timeouts=Timeouts(**settings(Timeouts, TIMEOUT_SUFFIX)),
        api_key=environ.get(args.api_key_env) or None,
        engine_api_key=environ.get(args.engine_api_key_env) or None,
        admin_key=environ.get(args.admin_key_env) or None,
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine and args.mode != "colocated":
        parser.error("--engine lists colocated engines; disaggregated instances register over ZMQ")
    for url in args.engine:
        try:
            static_engine(url)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        expected_by_address([parse_expected_engine(text) for text in args.expected_engine])
    except ValueError as exc:
        parser.error(str(exc))
    if not args.registration_address.startswith(("tcp://", "ipc://")):
        parser.error("--registration-address wants tcp://HOST:PORT (or ipc://PATH)")
    if args.kv_wait_limit is not None and args.kv_wait_timeout > args.kv_wait_limit:
        parser.error(f"--kv-wait-timeout {args.kv_wait_timeout:g} is above --kv-wait-limit {args.kv_wait_limit:g}")
    if args.otlp_traces_endpoint and (problem := tracing.missing()) is not None:
        parser.error(problem)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def route(config: RouterConfig) -> None:
    await serve_router(config, _stop_on_signals())


async def serve(config: ProxyConfig) -> None:
    stop = _stop_on_signals()
    server = ProxyServer(config)
    try:
        await server.start()
    except BaseException:
        await server.stop()  # release whatever was bound before the failure
        raise
    _tune_gc()
    await stop.wait()
    log.info("signal received: shutting down")
    await server.stop()


def _tune_gc() -> None:
    """Move what the start built (modules, classes, the registry, the metrics) out of the cyclic GC's
    reach: it lives as long as the process, and each full collection walked all of it, pausing the loop
    for about 12 ms at 64 saturated streams (docs/benchmarks.md); its garbage is collected first.

    Then collect the youngest generation after GC_GEN0_THRESHOLD net new objects, not Python's 700: the
    objects of the requests in flight made up most of each young generation, so every collection walked
    them and moved them on to be walked again in the older ones (6 % of the instructions at 64 streams)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.router:
        if not args.backend and not args.pddeployment:
            parser.error("--router needs --pddeployment NAME (EndpointSlice discovery) or --backend HOST:PORT")
        configure(args.log_level, args.log_format)
        try:
            eventloop.run(route(router_config(args, dict(os.environ))), args.loop)
        except OSError as exc:
            log.error("router could not start: %s", exc)
            return 1
        return 0
    _check(parser, args)
    configure(args.log_level, args.log_format)
    config = config_from_args(args, dict(os.environ))
    try:
        eventloop.run(serve(config), args.loop)
    except (OSError, zmq.ZMQError) as exc:  # e.g. a port already in use
        log.error("proxy could not start: %s", exc)
        return 1
    return 0
