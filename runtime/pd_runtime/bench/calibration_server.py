"""A minimal OpenAI streaming server with a fixed token cadence that records its own send times.

It exists to measure the bench client's timing error: the server notes when it received each request
and when it wrote each token, so TTFT and ITL as the client measured them can be compared with what
the server actually did. Fault knobs (500s, stalls, short replies) let tests check error counting.
Used by tests/bench and benchmarks/bench_client_accuracy.py; run standalone with
``python -m pd_runtime.bench.calibration_server --port 0`` (prints the URL it listens on).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from pd_runtime import eventloop

log = logging.getLogger(__name__)

clock = time.perf_counter
REQUEST_ID_HEADER = "X-Bench-Request-Id"


@dataclass(frozen=True)
class Behaviour:
    ttft_s: float = 0.05
    """Delay from receiving a request to writing its first token (a stand-in for prefill)."""
    itl_s: float = 0.01
    """Time between tokens; a chunk of k tokens is written every k * itl_s."""
    tokens_per_chunk: int = 1
    fail_every: int = 0
    """Every n-th request (counting from 1) gets a 500 with an OpenAI error body; 0 = never."""
    stall_every: int = 0
    """Every n-th request gets its headers and then nothing, until the client gives up."""
    max_output_tokens: int | None = None
    """Cap on tokens per reply, to produce short replies."""


@dataclass
class ServerTiming:
    """The server's own view of one request; times are ``clock()`` readings in this process."""

    request_id: str
    received: float
    status: int = 200
    prompt_tokens: int = 0
    tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.received

    @property
    def itl_s(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)


@dataclass
class CalibrationServer:
    behaviour: Behaviour = field(default_factory=Behaviour)
    timings: dict[str, ServerTiming] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/timings", self._timings)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen (port 0 = a free port) and return the base URL."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # handler_cancellation: a stalled handler ends when its client disconnects.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=4096).start()
        return f"http://{host}:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _timings(self, request: web.Request) -> web.Response:
        rows = [{**asdict(t), "ttft_s": t.ttft_s, "itl_s": t.itl_s} for t in self.timings.values()]
        return web.json_response(rows)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = clock()
        timing = ServerTiming(request_id=request.headers.get(REQUEST_ID_HEADER, f"anon-{received}"), received=received)
        self.timings[timing.request_id] = timing
        number = next(self._counter)
        try:
            body = await request.json()
            prompt_tokens, max_tokens = _validate(body, chat)
        except (ValueError, TypeError) as exc:
            timing.status = 400
            return _error(400, f"invalid request: {exc}", "BadRequestError")
        if _every(self.behaviour.fail_every, number):
            timing.status = 500
            return _error(500, "injected failure", "InternalServerError")
        timing.prompt_tokens = prompt_tokens
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if _every(self.behaviour.stall_every, number):
            await asyncio.Event().wait()
        if chat:
            await response.write(_event(_chat_chunk({"role": "assistant", "content": ""}, None)))
        tokens = min(max_tokens, self.behaviour.max_output_tokens or max_tokens)
        await self._stream_tokens(response, timing, tokens, chat)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        await response.write(_event({"object": "usage", "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stream_tokens(self, response: web.StreamResponse, timing: ServerTiming, tokens: int, chat: bool) -> None:
        """Write chunks on an absolute schedule so the cadence does not drift with load."""
        per_chunk = max(1, self.behaviour.tokens_per_chunk)
        first_due = timing.received + self.behaviour.ttft_s
        for start in range(0, tokens, per_chunk):
            count = min(per_chunk, tokens - start)
            await _sleep_until(first_due + start * self.behaviour.itl_s)
            last = start + count >= tokens
            finish = "length" if last else None
            text = " tok" * count
            chunk = _chat_chunk({"content": text}, finish) if chat else _completion_chunk(text, finish)
            sent = clock()
            timing.first_token = sent if timing.first_token is None else timing.first_token
            timing.last_token = sent
            timing.tokens += count
            await response.write(_event(chunk))


def _validate(body: Any, chat: bool) -> tuple[int, int]:
    """(prompt tokens, max_tokens) of a well-formed streaming request, else ValueError."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    if body.get("stream") is not True:
        raise ValueError("this server only streams")
    if not (body.get("stream_options") or {}).get("include_usage"):
        raise ValueError("stream_options.include_usage must be true")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        return sum(len(str(m.get("content", "")).split()) for m in messages), max_tokens
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt), max_tokens
    if isinstance(prompt, str):
        return len(prompt.split()), max_tokens
    raise ValueError("prompt must be a string or a list of token ids")


def _every(n: int, number: int) -> bool:
    return n > 0 and number % n == 0


async def _sleep_until(deadline: float) -> None:
    delay = deadline - clock()
    if delay > 0:
        await asyncio.sleep(delay)


def _completion_chunk(text: str, finish: str | None) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _chat_chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pd_runtime.bench.calibration_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    args = parser.parse_args(argv)
    behaviour = Behaviour(ttft_s=args.ttft_ms / 1e3, itl_s=args.itl_ms / 1e3, tokens_per_chunk=args.tokens_per_chunk)
    eventloop.run(_serve_forever(CalibrationServer(behaviour), args.host, args.port))
    return 0


async def _serve_forever(server: CalibrationServer, host: str, port: int) -> None:
    url = await server.start(host, port)
    sys.stdout.write(f"listening on {url}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop()


if __name__ == "__main__":
    sys.exit(main())
