"""Reserved ports: nobody else gets them between the choice and the server's bind, and the server can."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pd_runtime.localports import PortReservation


def _plain_bind(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_a_reserved_port_is_nobody_elses_but_a_server_can_listen_on_it() -> None:
    with PortReservation() as ports:
        port = ports.port()
        assert not _plain_bind(port)  # another holder or a server without SO_REUSEADDR: refused
        others = [socket.socket() for _ in range(500)]
        try:
            for sock in others:
                sock.bind(("127.0.0.1", 0))
            assert port not in {sock.getsockname()[1] for sock in others}  # bind(0) never picks it
        finally:
            for sock in others:
                sock.close()
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)  # joins the reservation
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await reader.read() == b""
        writer.close()
        server.close()
        await server.wait_closed()


def test_a_block_is_consecutive_and_held() -> None:
    with PortReservation() as ports:
        base = ports.block(3)
        assert not any(_plain_bind(base + i) for i in range(3))
    assert all(_plain_bind(base + i) for i in range(3))


def test_a_block_that_cannot_be_found_says_so() -> None:
    with PortReservation() as ports, pytest.raises(RuntimeError, match="consecutive"):
        ports.block(70000)
