"""A process that is not one of the pod's engines: it answers HTTP like an engine and sends registration
frames to the proxy, as any process in the pod's network namespace (or, with hostNetwork, on the node)
can. Every request it receives is appended to ``--hits``; a test runs it in the pod's namespace with
``nsenter --net`` and reads that file.

    python e2e/rogue_engine.py --port 45555 --hits FILE --frame JSON [--frame JSON ...]
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import threading
import time
from pathlib import Path

import msgpack
import zmq

log = logging.getLogger("rogue-engine")
MODELS = json.dumps({"object": "list", "data": [{"id": "rogue", "object": "model"}]}).encode()


def handler(hits: Path) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        """/health 200, /v1/models a list, anything POSTed recorded and answered with an empty object."""

        def do_GET(self) -> None:
            self._answer(MODELS if self.path == "/v1/models" else b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with hits.open("a") as out:
                out.write(f"{self.command} {self.path}\n")
            self._answer(b"{}")

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug(format, *args)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="HTTP port, on every address")
    parser.add_argument("--hits", type=Path, required=True)
    parser.add_argument("--registration", default="tcp://127.0.0.1:36367")
    parser.add_argument("--frame", action="append", default=[], help="a registration map as JSON (repeat)")
    parser.add_argument("--interval", type=float, default=0.3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rogue %(message)s")
    server = http.server.ThreadingHTTPServer(("0.0.0.0", args.port), handler(args.hits))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    frames = [msgpack.packb(json.loads(text)) for text in args.frame]
    context = zmq.Context()
    # One DEALER per frame, as vLLM opens one per engine: the proxy shuts down a connection whose frame
    # it refuses, and the DEALER reconnects for the next beat.
    sockets = [context.socket(zmq.DEALER) for _ in frames]
    for sock in sockets:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(args.registration)
    log.info("serving on :%d, %d frames to %s every %g s", args.port, len(frames), args.registration, args.interval)
    while True:  # until the test ends the process group
        for sock, frame in zip(sockets, frames, strict=True):
            sock.send(frame)
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
