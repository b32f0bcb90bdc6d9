"""`pdctl sim-engine MODEL [vllm serve arguments...] [--profile NAME] [--time-scale X]`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from aiohttp import web

from pd_runtime import protocol
from pd_runtime.sim.config import ConfigError, EngineConfig, build_parser, parse_args
from pd_runtime.sim.engine import SimEngine
from pd_runtime.sim.heartbeat import Heartbeat
from pd_runtime.sim.profiles import Profile, get_profile
from pd_runtime.sim.server import build_app

log = logging.getLogger(__name__)


def registration(config: EngineConfig) -> protocol.Registration | None:
    """What this instance announces to the proxy, or None when it must not register."""
    conn = config.connector
    if conn is None or not conn.proxy_ip or config.faults.no_register:
        return None
    return protocol.Registration(
        role=conn.role,
        host=conn.host_ip,
        http_port=conn.http_port,
        handshake_port=conn.handshake_port,
        notify_port=conn.notify_port,
        dp_size=config.dp,
        tp_size=config.tp,
        transfer_mode=conn.transfer_mode,
        generation=config.registration,
    )


async def serve(config: EngineConfig, profile: Profile) -> None:
    engine = SimEngine(config, profile)
    await engine.start()
    # handler_cancellation: a client that goes away aborts its request, as vLLM does on disconnect.
    runner = web.AppRunner(build_app(engine), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info(
        "sim-engine %s (%s, tp=%d, dp=%d, profile %s, time scale %g) serving on %s:%d",
        config.model,
        "colocated" if config.connector is None else config.connector.role,
        config.tp,
        config.dp,
        profile.name,
        config.time_scale,
        config.host,
        config.port,
    )
    reg = registration(config)
    heartbeat = None
    if reg is not None and config.connector is not None:
        address = f"tcp://{config.connector.proxy_ip}:{config.connector.proxy_ping_port}"
        heartbeat = Heartbeat(address, reg)
        heartbeat.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("sim-engine shutting down")
        if heartbeat is not None:
            heartbeat.stop()
        engine.stopping.set()
        await runner.cleanup()
        await engine.stop()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if any(arg in ("-h", "--help") for arg in argv):
        build_parser().print_help(sys.stdout)
        return 0
    try:
        config = parse_args(argv)
        profile = get_profile(config.profile)
    except (ConfigError, ValueError) as exc:
        sys.stderr.write(f"pdctl sim-engine: {exc}\n")
        return 2
    if config.ignored_flags:
        log.info("accepted and ignored vLLM flags: %s", " ".join(config.ignored_flags))
    try:
        asyncio.run(serve(config, profile))
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        return 1
    return 0
