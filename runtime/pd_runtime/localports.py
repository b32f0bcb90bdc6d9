"""Free TCP ports on 127.0.0.1, for local stacks (sim, e2e, benchmarks) and tests: never fixed ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS reports free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free ports (the side channels bind base + rank)."""
    for _ in range(100):
        base = free_port()
        if base + count < 65536 and all(_is_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
