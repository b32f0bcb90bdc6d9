"""A host-memory stand-in for AMD's ``mori.io`` (the RDMA engine vLLM's MoRIIOConnector drives).

It offers the names vLLM 0.31's connector imports (vllm/distributed/kv_transfer/kv_connector/v1/moriio/
moriio_connector.py and moriio_engine.py) and does what they promise, one-sided: a session's
``batch_write`` copies byte ranges of a registered local tensor into the peer's registered tensor, and
``batch_read`` copies the peer's ranges into the local one, the peer process taking no part beyond
serving its memory. The bytes travel over TCP (loopback in the tests) to the :class:`IOEngine`'s server
at ``IOEngineConfig(host, port)``, framed as msgpack messages. Statuses complete asynchronously on a
worker thread, as RDMA completions do.

Fault switches, for the live tier's tests: the file named by ``PD_LIVE_MORI_FAULTS`` is read (JSON) at
every transfer by the side that starts it (prefill in write mode, decode in read mode); it may say

- ``{"fault": "corrupt"}``: the bytes moved are zeros (the status still succeeds);
- ``{"fault": "drop"}``: nothing is moved and the status never completes;
- ``{"fault": "delay", "seconds": 2.5}``: the transfer completes that much later;
- ``{"fault": "fail"}``: nothing is moved and the status fails (``Code() == 1``, ``Message()`` says why).

No file, an empty file or ``{}`` means no fault. Every transfer appends one JSON line to the file named by
``PD_LIVE_MORI_LOG`` when set (what moved, how many bytes, which fault), so a test can tell that KV moved.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import json
import logging
import os
import socket
import socketserver
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import msgpack

log = logging.getLogger("mori.io")

FAULTS_ENV = "PD_LIVE_MORI_FAULTS"
LOG_ENV = "PD_LIVE_MORI_LOG"


class BackendType(enum.Enum):
    RDMA = "rdma"
    XGMI = "xgmi"


class PollCqMode(enum.Enum):
    POLLING = "polling"
    EVENT = "event"


class RdmaBackendConfig:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


class XgmiBackendConfig(RdmaBackendConfig):
    pass


@dataclass(frozen=True)
class IOEngineConfig:
    host: str
    port: int


class _Packed:
    """mori's descriptors travel packed (``pack()`` / ``Cls.unpack(bytes)``): here as msgpack maps."""

    def pack(self) -> bytes:
        return bytes(msgpack.packb(asdict(self)))  # type: ignore[call-overload]

    @classmethod
    def unpack(cls, packed: bytes) -> Self:
        return cls(**msgpack.unpackb(packed))


@dataclass(frozen=True)
class EngineDesc(_Packed):
    key: str
    host: str
    port: int


@dataclass(frozen=True)
class MemoryDesc(_Packed):
    engine_key: str
    mem_id: int
    data: int  # the address of the registered bytes, as mori's MemoryDesc.data
    size: int


class TransferStatus:
    """One transfer's completion, polled by vLLM (``Succeeded()``, ``Failed()``, ``Message()``, ``Code()``)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._code = 0
        self._message = ""

    def Succeeded(self) -> bool:
        return self._done.is_set() and self._code == 0

    def Failed(self) -> bool:
        return self._done.is_set() and self._code != 0

    def InProgress(self) -> bool:
        return not self._done.is_set()

    def Message(self) -> str:
        return self._message

    def Code(self) -> int:
        return self._code

    def Wait(self) -> None:
        self._done.wait()

    def finish(self, code: int = 0, message: str = "") -> None:
        self._code, self._message = code, message
        self._done.set()


def _memory(ptr: int, size: int) -> memoryview:
    """The registered bytes at ``ptr`` (a CPU tensor's storage, kept alive by the registry)."""
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def current_fault() -> dict[str, Any]:
    path = os.environ.get(FAULTS_ENV)
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    fault: dict[str, Any] = json.loads(text) if text.strip() else {}
    return fault


def _record(entry: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(msgpack.packb(message))


def _receive(unpacker: msgpack.Unpacker, sock: socket.socket) -> Any:
    for message in unpacker:
        return message
    while True:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("mori.io stand-in: peer closed the connection")
        unpacker.feed(data)
        for message in unpacker:
            return message


class _Handler(socketserver.BaseRequestHandler):
    """Serves one peer's one-sided operations on this engine's registered memory."""

    server: _Server

    def handle(self) -> None:
        unpacker = msgpack.Unpacker(max_buffer_size=1 << 31)
        while True:
            try:
                request = _receive(unpacker, self.request)
            except ConnectionError:
                return
            region = self.server.engine.region(request["mem"])
            if request["op"] == "write":
                for offset, chunk in zip(request["offsets"], request["chunks"], strict=True):
                    region[offset : offset + len(chunk)] = chunk
                _send(self.request, {"ok": True})
            else:
                chunks = [bytes(region[o : o + s]) for o, s in zip(request["offsets"], request["sizes"], strict=True)]
                _send(self.request, {"ok": True, "chunks": chunks})


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, engine: IOEngine, address: tuple[str, int]) -> None:
        self.engine = engine
        super().__init__(address, _Handler)


class IOEngine:
    def __init__(self, key: str, config: IOEngineConfig) -> None:
        self.key = key
        self._server = _Server(self, (config.host, config.port))
        self._host, self._port = config.host, self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="mori-standin-server").start()
        self._remotes: dict[str, EngineDesc] = {}
        self._regions: dict[int, tuple[Any, memoryview]] = {}
        self._ids = itertools.count(1)
        self._uids = itertools.count(1)
        self._lock = threading.Lock()
        log.info("mori.io stand-in engine %s serving on %s:%d", key, self._host, self._port)

    def create_backend(self, backend_type: BackendType, config: RdmaBackendConfig) -> None:
        log.info("mori.io stand-in: backend %s (host memory over TCP)", backend_type)

    def get_engine_desc(self) -> EngineDesc:
        return EngineDesc(self.key, self._host, self._port)

    def register_remote_engine(self, desc: EngineDesc) -> None:
        self._remotes[desc.key] = desc

    def register_torch_tensor(self, tensor: Any) -> MemoryDesc:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(
                f"mori.io stand-in registers contiguous CPU tensors, got {tensor.device} {tensor.stride()}"
            )
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            mem_id = next(self._ids)
            self._regions[mem_id] = (tensor, _memory(tensor.data_ptr(), size))
        return MemoryDesc(self.key, mem_id, tensor.data_ptr(), size)

    def region(self, mem_id: int) -> memoryview:
        return self._regions[mem_id][1]

    def create_session(self, local: MemoryDesc, remote: MemoryDesc) -> Session:
        return Session(self, local, self._remotes[remote.engine_key], remote)

    def allocate_transfer_uid(self) -> int:
        return next(self._uids)


class Session:
    """Transfers between one local and one remote registered region, in order, on one connection."""

    def __init__(self, engine: IOEngine, local: MemoryDesc, peer: EngineDesc, remote: MemoryDesc) -> None:
        self._engine, self._local, self._peer, self._remote = engine, local, peer, remote
        self._sock: socket.socket | None = None
        self._unpacker = msgpack.Unpacker(max_buffer_size=1 << 31)
        self._lock = threading.Lock()

    def batch_write(
        self, local_offsets: list[int], remote_offsets: list[int], sizes: list[int], uid: int
    ) -> TransferStatus:
        return self._start("write", list(local_offsets), list(remote_offsets), list(sizes), uid)

    def batch_read(
        self, local_offsets: list[int], remote_offsets: list[int], sizes: list[int], uid: int
    ) -> TransferStatus:
        return self._start("read", list(local_offsets), list(remote_offsets), list(sizes), uid)

    def _start(self, op: str, local: list[int], remote: list[int], sizes: list[int], uid: int) -> TransferStatus:
        status = TransferStatus()
        fault = current_fault()
        _record({"op": op, "uid": uid, "bytes": sum(sizes), "ranges": len(sizes), "fault": fault.get("fault")})
        if fault.get("fault") == "drop":
            log.warning("mori.io stand-in: dropping %s uid %d (fault switch)", op, uid)
            return status
        if fault.get("fault") == "fail":
            log.warning("mori.io stand-in: failing %s uid %d (fault switch)", op, uid)
            status.finish(1, f"mori.io stand-in: injected failure of {op} uid {uid}")
            return status
        delay = float(fault.get("seconds", 0)) if fault.get("fault") == "delay" else 0.0
        corrupt = fault.get("fault") == "corrupt"
        threading.Thread(target=self._run, args=(status, op, local, remote, sizes, delay, corrupt), daemon=True).start()
        return status

    def _run(
        self,
        status: TransferStatus,
        op: str,
        local: list[int],
        remote: list[int],
        sizes: list[int],
        delay: float,
        corrupt: bool,
    ) -> None:
        try:
            if delay:
                time.sleep(delay)
            region = self._engine.region(self._local.mem_id)
            with self._lock:
                if op == "write":
                    chunks = [
                        bytes(s) if corrupt else bytes(region[o : o + s]) for o, s in zip(local, sizes, strict=True)
                    ]
                    self._call({"op": "write", "mem": self._remote.mem_id, "offsets": remote, "chunks": chunks})
                else:
                    reply = self._call({"op": "read", "mem": self._remote.mem_id, "offsets": remote, "sizes": sizes})
                    for offset, chunk in zip(local, reply["chunks"], strict=True):
                        region[offset : offset + len(chunk)] = bytes(len(chunk)) if corrupt else chunk
        except Exception as e:
            log.exception("mori.io stand-in: %s failed", op)
            status.finish(2, f"mori.io stand-in: {op} failed: {e}")
            return
        status.finish()

    def _call(self, message: dict[str, Any]) -> Any:
        if self._sock is None:
            self._sock = socket.create_connection((self._peer.host, self._peer.port))
        _send(self._sock, message)
        return _receive(self._unpacker, self._sock)
