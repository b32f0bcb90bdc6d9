"""Many registration connections from one process, as an attacker on the proxy's loopback would open them.

``python -m tests.proxy.registration_flood HOST PORT CONNECTIONS FRAMES HOLD_S OUT`` opens CONNECTIONS TCP
connections, speaks ZMTP 3.1 with the NULL mechanism as a DEALER would (greeting, READY, then one
message frame per registration: https://rfc.zeromq.org/spec/37/), sends FRAMES well-formed G2 heartbeats
of an engine nobody rendered on each, and holds every connection the proxy keeps for HOLD_S seconds after
the last one is open. Raw sockets rather than pyzmq: a context holds at most 1023 sockets, and libzmq
would reconnect whatever the proxy drops. Writes OUT, a JSON object: how many connections were opened,
how many sent their frames, and how many the proxy closed.
"""

from __future__ import annotations

import asyncio
import json
import resource
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import msgpack

# The greeting of libzmq 4.x: signature (0xFF, 8 bytes whose last is 1, 0x7F), version 3.1, mechanism NULL.
GREETING = b"\xff" + bytes(7) + b"\x01\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
_READY_BODY = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY
CONNECTS_AT_ONCE = 256  # connections in their handshake at any moment (the proxy's listen backlog is 100)


def message_frame(body: bytes) -> bytes:
    """One ZMTP message frame, the last (and only) part of its message."""
    if len(body) < 256:
        return b"\x00" + bytes([len(body)]) + body
    return b"\x02" + struct.pack(">Q", len(body)) + body


def stranger_heartbeat(index: int) -> bytes:
    """A well-formed G2 heartbeat of a decode engine no operator rendered."""
    port = 20_000 + index % 40_000
    return msgpack.packb(
        {
            "type": "D",
            "http_address": f"127.0.0.1:{port}",
            "zmq_address": f"host:127.0.0.1,handshake:{port},notify:{port}",
            "dp_size": 1,
            "tp_size": 1,
            "transfer_mode": "WRITE",
        }
    )


@dataclass
class Tally:
    opened: int = 0
    sent: int = 0
    closed_by_proxy: int = 0
    failed: int = 0


async def one_connection(host: str, port: int, payload: bytes, gate: asyncio.Semaphore, tally: Tally) -> None:
    async with gate:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            tally.failed += 1
            return
        tally.opened += 1
        try:
            writer.write(GREETING + READY)
            await reader.readexactly(len(GREETING))
            command = await reader.readexactly(2)  # the proxy's READY: flags, then a one-byte size
            await reader.readexactly(command[1])
            writer.write(payload)  # frames before the handshake ends would be taken for commands
            await writer.drain()
            tally.sent += 1
        except (OSError, asyncio.IncompleteReadError):
            tally.closed_by_proxy += 1
            return
    try:
        await reader.read(1)  # b"" once the proxy closes the connection
        tally.closed_by_proxy += 1
    except OSError:
        tally.closed_by_proxy += 1


async def flood(host: str, port: int, connections: int, frames: int, hold_s: float) -> Tally:
    tally = Tally()
    gate = asyncio.Semaphore(CONNECTS_AT_ONCE)
    tasks = [
        asyncio.create_task(one_connection(host, port, message_frame(stranger_heartbeat(i)) * frames, gate, tally))
        for i in range(connections)
    ]
    while tally.opened + tally.failed < connections:
        await asyncio.sleep(0.05)
    await asyncio.sleep(hold_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally


def main() -> None:
    host, port, connections, frames, hold_s, out = sys.argv[1:7]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tally = asyncio.run(flood(host, int(port), int(connections), int(frames), float(hold_s)))
    Path(out).write_text(json.dumps(asdict(tally)))


if __name__ == "__main__":
    main()
