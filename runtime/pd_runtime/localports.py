"""Ports on 127.0.0.1 for local stacks (sim, e2e, benchmarks) and tests: never fixed ports, never raced.

Choosing a free port, closing it and handing its number to a server that binds it later leaves a gap in
which anything else on the machine can take it: another test's free port, or the ephemeral source port
of any outgoing connection ("address already in use", seen on these shared machines). A
``PortReservation`` closes the gap: each port it hands out stays bound in this process until
``release``, and the server joins it. The holder binds exclusively (no SO_REUSEADDR, so no other holder
or listener has it), then sets SO_REUSEADDR: Linux then lets a server that also sets SO_REUSEADDR bind
and listen on the port while the holder, which never listens, keeps it. asyncio, aiohttp, ZMQ,
http.server and Go's net.Listen all set SO_REUSEADDR on their listeners. Neither bind(port 0) nor an
outgoing connection's port choice picks a port that is bound, so nothing else can take it meanwhile.
Release once the servers are up (they hold the ports themselves from then on).
"""

from __future__ import annotations

import socket
from types import TracebackType


class PortReservation:
    """Ports held for servers about to start; ``with`` releases them on the way out."""

    def __init__(self) -> None:
        self._held: list[socket.socket] = []

    def port(self) -> int:
        """A port no one else has, held until ``release``."""
        sock = self._hold(0)
        assert sock is not None  # bind(0) always finds one
        port: int = sock.getsockname()[1]
        return port

    def block(self, count: int) -> int:
        """A base port with ``count`` consecutive ports held (the side channels bind base + rank)."""
        for _ in range(100):
            start = len(self._held)
            base = self.port()
            if base + count <= 65536 and all(self._hold(base + i) is not None for i in range(1, count)):
                return base
            for sock in self._held[start:]:
                sock.close()
            del self._held[start:]
        raise RuntimeError(f"no {count} consecutive free ports")

    def release(self) -> None:
        for sock in self._held:
            sock.close()
        self._held.clear()

    def _hold(self, port: int) -> socket.socket | None:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            return None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # from now on a server may join it
        self._held.append(sock)
        return sock

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def bound_socket(backlog: int = 128) -> socket.socket:
    """A listening socket on a port of its own, for a server in this process (``sock=`` of asyncio and
    aiohttp): bound to port 0, so there is no gap at all."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock
