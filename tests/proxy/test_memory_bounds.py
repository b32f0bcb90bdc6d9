"""The proxy's memory under request bodies it must not keep (issue 28), measured on a real ``pdctl proxy``
process: its resident set (VmRSS) and high-water mark (VmHWM) from /proc.

Before the key was checked on the head, the issue's attack (33 connections without the key, each holding a
32 MiB body one byte short of complete) took the proxy from 46 to 1102 MiB here, and that memory stayed after
the clients left. The bounds below are generous against a loaded machine, and far under that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.ports import TEST_PORTS

MIB = 1024 * 1024
ATTACK_BODY = 32 * MIB
ATTACKERS = 33
GROWTH_BOUND = 64 * MIB  # what the attack may add to the proxy's resident set, at its peak
RETURNED_BOUND = 16 * MIB  # above the baseline once the clients have gone

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")


@dataclass
class Proxy:
    port: int
    pid: int

    def memory(self, field: str) -> int:
        """``VmRSS`` or ``VmHWM`` of the proxy process, in bytes."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"{field} not in /proc/{self.pid}/status")

    async def rss_once(self, reached: Callable[[int], bool], timeout: float = 20.0) -> int:
        """The resident set once ``reached`` says so (or after ``timeout``): reading and freeing take time."""
        deadline = time.monotonic() + timeout
        while not reached(rss := self.memory("VmRSS")) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return rss


@contextlib.contextmanager
def running_proxy(*flags: str) -> Iterator[Proxy]:
    """``pdctl proxy`` with the client key ``secret`` and no engines (nothing here reaches one)."""
    port = TEST_PORTS.port()
    command = [sys.executable, "-m", "pd_runtime.cli", "proxy", "--port", str(port),
               "--admin-port", str(TEST_PORTS.port()), "--transfer-mode", "read",
               "--registration-address", f"tcp://127.0.0.1:{TEST_PORTS.port()}", *flags]  # fmt: skip
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PD_PROXY_API_KEY": "secret"}
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "proxy ready to serve" in line:
                break
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # the log never fills its pipe
        yield Proxy(port, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _warm(port: int) -> None:
    """One request answered, so the baseline includes what the first one allocates."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await reader.read()
    writer.close()


async def _almost_send(port: int, length: int, key: bytes) -> asyncio.StreamWriter:
    """A head for a body of ``length`` bytes, then all of it but the last byte, as fast as the proxy
    reads it (or until it closes the connection)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (length, key))
    piece, left = b"{" * MIB, length - 1
    with contextlib.suppress(ConnectionError):
        while left > 0:
            writer.write(piece[:left])
            left -= min(left, len(piece))
            await writer.drain()
    return writer


async def test_unauthenticated_bodies_hold_no_memory() -> None:
    """The issue's attack: each connection is answered 401 on its head and its body never buffered."""
    with running_proxy("--max-body-bytes", str(ATTACK_BODY)) as proxy:  # the size limit does not refuse it
        await _warm(proxy.port)
        baseline = proxy.memory("VmRSS")
        writers = await asyncio.gather(*(_almost_send(proxy.port, ATTACK_BODY, b"") for _ in range(ATTACKERS)))
        peak = proxy.memory("VmHWM")
        for writer in writers:
            writer.close()
        after = await proxy.rss_once(lambda rss: rss < baseline + RETURNED_BOUND)
    assert peak < baseline + GROWTH_BOUND, f"baseline {baseline / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB"
    assert after < baseline + RETURNED_BOUND, f"baseline {baseline / MIB:.0f} MiB, after {after / MIB:.0f} MiB"


async def test_authenticated_bodies_are_returned_to_the_system_when_their_clients_leave() -> None:
    """16 bodies of 8 MiB held at once, one byte short; once their clients have gone, so is the memory
    (bodies are single buffers, freed whole, not thousands of 4 KiB pieces the allocator keeps)."""
    with running_proxy() as proxy:
        await _warm(proxy.port)
        baseline = proxy.memory("VmRSS")
        key = b"Authorization: Bearer secret\r\n"
        writers = await asyncio.gather(*(_almost_send(proxy.port, 8 * MIB, key) for _ in range(16)))
        held = await proxy.rss_once(lambda rss: rss > baseline + 96 * MIB)
        for writer in writers:
            writer.close()
        after = await proxy.rss_once(lambda rss: rss < baseline + RETURNED_BOUND)
    assert held > baseline + 96 * MIB, f"the bodies were not held: {baseline / MIB:.0f} -> {held / MIB:.0f} MiB"
    assert after < baseline + RETURNED_BOUND, f"baseline {baseline / MIB:.0f} MiB, after {after / MIB:.0f} MiB"
