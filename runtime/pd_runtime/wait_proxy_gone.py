"""`pdctl wait-proxy-gone`: the engines' preStop hook; returns once the pod's proxy has finished draining.

The kubelet sends SIGTERM to every container of a deleted pod at once, and runs a container's preStop
hook before its SIGTERM. The proxy drains on SIGTERM (/ready 503 while still serving for its drain
delay, then in-flight streams finish) and closes its admin port last; the engines it relays to must
serve until then, which this command, as their preStop hook, ensures. It reads the proxy's
``/status`` on the admin port on 127.0.0.1 (the pod's own loopback) and waits while the proxy says it
is ``leaving`` (with the admin key from ``PD_PROXY_ADMIN_KEY`` when set: a pod on the node's network
needs it, as its loopback is the node's), until nothing accepts connections there, for at most
``--timeout`` (the proxy's own drain bound; the kubelet also ends the hook at the grace period). A
proxy that never listened (a pod deleted while starting) is gone at once. A proxy that stays serving
for ``--settle`` seconds is not leaving: only this engine is being restarted (a failed liveness probe),
which must not wait a drain.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from pd_runtime.argtypes import non_negative_float, port_number, positive_float

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
ADMIN_KEY_ENV = "PD_PROXY_ADMIN_KEY"  # the proxy's --admin-key-env default


class Look(enum.Enum):
    """What one GET of the proxy's /status found."""

    GONE = "gone"  # connection refused: nothing listens
    LEAVING = "leaving"  # the proxy got SIGTERM and drains
    SERVING = "serving"  # the proxy is not leaving
    UNKNOWN = "unknown"  # no usable answer (slow, an error status): looked at again


class Verdict(enum.Enum):
    WAIT = "wait"
    GONE = "gone"  # the proxy has drained (or never started): the engine may stop
    STAYS = "stays"  # the proxy is not leaving: only this container stops
    GAVE_UP = "gave_up"  # still draining at the timeout: the engine stops anyway


def verdict(look: Look, elapsed_s: float, timeout_s: float, settle_s: float) -> Verdict:
    """Pure: what one look means, ``elapsed_s`` after the hook started."""
    if look is Look.GONE:
        return Verdict.GONE
    if elapsed_s >= timeout_s:
        return Verdict.GAVE_UP
    if look is Look.SERVING and elapsed_s >= settle_s:
        return Verdict.STAYS
    return Verdict.WAIT


# Straight to the pod's loopback: an engine's environment often names an HTTP(S)_PROXY (model downloads
# behind a corporate proxy), which urllib would otherwise send this GET through.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def look(port: int, timeout_s: float, host: str = LOOPBACK, admin_key: str | None = None) -> Look:
    """GET http://host:port/status once, never through an HTTP proxy from the environment."""
    request = urllib.request.Request(f"http://{host}:{port}/status")
    if admin_key:
        request.add_header("Authorization", f"Bearer {admin_key}")
    try:
        with _DIRECT.open(request, timeout=timeout_s) as resp:
            document = json.load(resp)
    except urllib.error.URLError as err:
        if isinstance(err.reason, ConnectionRefusedError):
            return Look.GONE
        return Look.UNKNOWN
    except (OSError, ValueError):  # a reset, a timeout, a body that is not JSON
        return Look.UNKNOWN
    return Look.LEAVING if isinstance(document, dict) and document.get("leaving") is True else Look.SERVING


def wait(
    port: int,
    timeout_s: float,
    interval_s: float,
    settle_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    admin_key: str | None = None,
) -> Verdict:
    """Look at the proxy every ``interval_s`` until the verdict is no longer WAIT."""
    start = clock()
    while True:
        elapsed = clock() - start
        result = verdict(look(port, max(interval_s, 1.0), admin_key=admin_key), elapsed, timeout_s, settle_s)
        if result is not Verdict.WAIT:
            return result
        sleep(min(interval_s, max(0.0, timeout_s - elapsed)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl wait-proxy-gone",
        description="The engines' preStop hook: wait while the pod's proxy (admin port PORT on 127.0.0.1) "
        "drains, until it stops listening. Always exits 0: the kubelet sends SIGTERM next either way.",
    )
    parser.add_argument("--port", type=port_number, required=True, help="the proxy's admin port")
    parser.add_argument("--timeout", type=non_negative_float, required=True, help="give up after this many seconds")
    parser.add_argument("--interval", type=positive_float, default=0.5, help="seconds between looks (default 0.5)")
    parser.add_argument(
        "--settle",
        type=non_negative_float,
        default=3.0,
        help="a proxy still not leaving after this many seconds is not being deleted (default 3)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(list(argv))
    start = time.monotonic()
    result = wait(args.port, args.timeout, args.interval, args.settle, admin_key=os.environ.get(ADMIN_KEY_ENV))
    waited = time.monotonic() - start
    where = f"{LOOPBACK}:{args.port}"
    if result is Verdict.GONE:
        logger.info("the proxy on %s is gone after %.1fs: the engine may stop", where, waited)
    elif result is Verdict.STAYS:
        logger.info("the proxy on %s is not leaving: only this engine stops", where)
    else:
        logger.warning("the proxy on %s still drains after %.1fs: the engine stops anyway", where, waited)
    return 0
