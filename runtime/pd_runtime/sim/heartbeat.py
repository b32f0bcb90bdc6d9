"""Registration heartbeats to the proxy (docs/protocol.md#registration-socket): one DEALER, one msgpack frame per beat.

A dedicated thread with its own (synchronous) ZMQ context beats at a fixed cadence whatever the event
loop is doing, and dies with the process, so a crashed engine stops registering. Exactly one stream
per instance, like vLLM's global rank 0.
"""

from __future__ import annotations

import logging
import threading

import zmq

from pd_runtime import protocol

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, address: str, registration: protocol.Registration, interval_s: float | None = None) -> None:
        self._address = address
        self._registration = registration
        self._interval_s = interval_s or protocol.PING_INTERVAL_S[registration.generation]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-heartbeat", daemon=True)
        self.beats = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _frame(self) -> bytes:
        reg = self._registration
        payload = protocol.g1_payload(reg, self.beats) if reg.generation == "G1" else protocol.g2_payload(reg)
        return protocol.encode_frame(payload)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        sock.connect(self._address)
        log.info(
            "registering %s %s with %s every %.0f s",
            self._registration.role,
            self._registration.http_address,
            self._address,
            self._interval_s,
        )
        try:
            while not self._stop.is_set():
                try:
                    sock.send(self._frame())
                    self.beats += 1
                except zmq.Again:
                    log.warning("heartbeat to %s not sent (queue full)", self._address)
                self._stop.wait(self._interval_s)
        finally:
            sock.close(linger=0)
            ctx.term()
