"""`pdctl proxy`: parse flags into a ProxyConfig, run the server until SIGTERM/SIGINT, drain, exit."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

import zmq

from pd_runtime import eventloop
from pd_runtime.argtypes import non_negative_float, positive_float
from pd_runtime.protocol import REGISTRATION_PORT
from pd_runtime.proxy.config import ProxyConfig, Timeouts
from pd_runtime.proxy.logs import configure
from pd_runtime.proxy.registry import static_engine
from pd_runtime.proxy.routing import POLICIES
from pd_runtime.proxy.server import ProxyServer

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdctl proxy",
        description="MoRI-IO prefill/decode proxy: OpenAI API in, prefill and decode legs out (docs/proxy.md).",
    )
    p.add_argument("--host", default="127.0.0.1", help="API listen address (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="API port (default %(default)s)")
    p.add_argument(
        "--registration-address",
        default=f"tcp://127.0.0.1:{REGISTRATION_PORT}",
        help="ZMQ ROUTER bind address for engine heartbeats (default %(default)s)",
    )
    p.add_argument("--mode", choices=("disaggregated", "colocated"), default="disaggregated")
    p.add_argument(
        "--transfer-mode",
        choices=("auto", "write", "read"),
        default="auto",
        help="auto: taken from the first registration; instances with another mode are refused",
    )
    p.add_argument(
        "--engine", action="append", default=[], metavar="URL", help="static engine http://host:port (colocated)"
    )
    p.add_argument("--policy", choices=POLICIES, default="round_robin")
    p.add_argument(
        "--heartbeat-ttl",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="evict an instance this long after its last heartbeat (default: 3 heartbeat intervals, 9 s G2, 15 s G1)",
    )
    p.add_argument("--admin-host", default=None, help="admin listen address (default: --host)")
    p.add_argument("--admin-port", type=int, default=8001, help="admin port for /status and /metrics; 0 picks one")
    defaults = Timeouts()
    p.add_argument("--connect-timeout", type=positive_float, default=defaults.connect)
    p.add_argument("--prefill-timeout", type=positive_float, default=defaults.prefill, help="whole prefill leg")
    p.add_argument(
        "--first-byte-timeout", type=positive_float, default=defaults.first_byte, help="streaming decode: first byte"
    )
    p.add_argument(
        "--idle-timeout", type=positive_float, default=defaults.idle, help="streaming decode: gap between chunks"
    )
    p.add_argument(
        "--response-timeout", type=positive_float, default=defaults.response, help="non-streaming decode: whole answer"
    )
    p.add_argument("--health-interval", type=positive_float, default=5.0, help="seconds between /health probes")
    p.add_argument("--health-timeout", type=positive_float, default=defaults.health)
    p.add_argument(
        "--max-tokens-policy",
        choices=("exact", "decrement"),
        default="exact",
        help="decode-leg token limit: exact = the client's, decrement = minus 1 like vLLM's toy proxy",
    )
    p.add_argument("--max-tokens-limit", type=int, default=1_000_000, help="reject larger max_tokens with 400")
    p.add_argument(
        "--read-fallback",
        choices=("decode", "error"),
        default="decode",
        help="when prefill yields no usable kv_transfer_params: plain request to decode, or an error",
    )
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument(
        "--max-in-flight", type=int, default=0, help="answer 503 + Retry-After past this many requests; 0: no limit"
    )
    p.add_argument("--api-key-env", default="PD_PROXY_API_KEY", help="env var with the key clients must send")
    p.add_argument("--engine-api-key-env", default="VLLM_API_KEY", help="env var with the engines' key")
    p.add_argument("--canary-interval", type=non_negative_float, default=0.0, help="seconds; 0 disables the canary")
    p.add_argument(
        "--canary-model", default=None, help="model for the canary (default: first one a decode engine lists)"
    )
    p.add_argument(
        "--drain-timeout", type=non_negative_float, default=30.0, help="seconds to let streams finish on SIGTERM"
    )
    p.add_argument("--loop", choices=eventloop.LOOP_CHOICES, default="auto", help="auto: uvloop when installed")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    return p


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> ProxyConfig:
    return ProxyConfig(
        host=args.host,
        port=args.port,
        registration_address=args.registration_address,
        mode=args.mode,
        transfer_mode=args.transfer_mode,
        engines=tuple(args.engine),
        policy=args.policy,
        heartbeat_ttl_s=args.heartbeat_ttl,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        timeouts=Timeouts(
            connect=args.connect_timeout,
            prefill=args.prefill_timeout,
            first_byte=args.first_byte_timeout,
            idle=args.idle_timeout,
            response=args.response_timeout,
            health=args.health_timeout,
        ),
        health_interval_s=args.health_interval,
        max_tokens_policy=args.max_tokens_policy,
        max_tokens_limit=args.max_tokens_limit,
        read_fallback=args.read_fallback,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
        api_key=environ.get(args.api_key_env) or None,
        engine_api_key=environ.get(args.engine_api_key_env) or None,
        canary_interval_s=args.canary_interval,
        canary_model=args.canary_model,
        drain_timeout_s=args.drain_timeout,
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine and args.mode != "colocated":
        parser.error("--engine lists colocated engines; disaggregated instances register over ZMQ")
    for url in args.engine:
        try:
            static_engine(url)
        except ValueError as exc:
            parser.error(str(exc))
    if not args.registration_address.startswith(("tcp://", "ipc://")):
        parser.error("--registration-address wants tcp://HOST:PORT (or ipc://PATH)")


async def serve(config: ProxyConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = ProxyServer(config)
    try:
        await server.start()
    except BaseException:
        await server.stop()  # release whatever was bound before the failure
        raise
    await stop.wait()
    log.info("signal received: shutting down")
    await server.stop()


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    _check(parser, args)
    configure(args.log_level, args.log_format)
    config = config_from_args(args, dict(os.environ))
    try:
        eventloop.run(serve(config), args.loop)
    except (OSError, zmq.ZMQError) as exc:  # e.g. a port already in use
        log.error("proxy could not start: %s", exc)
        return 1
    return 0
