"""Recording fake engines and a real ZMQ DEALER, for driving the proxy over loopback.

Formats here are written from docs/protocol.md#registration-g1, docs/protocol.md#registration-g2 and
docs/protocol.md#prefill-answer, not imported from protocol.py, so the contract tests check the proxy against
the documented formats rather than against itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from aiohttp import web
from multidict import CIMultiDict

from pd_runtime.localports import bound_socket
from pd_runtime.proxy.config import ProxyConfig
from pd_runtime.proxy.server import ProxyServer
from pd_runtime.sim import openai
from tests.ports import TEST_PORTS


@dataclass
class Recorded:
    """One request as an engine received it."""

    path: str
    headers: CIMultiDict[str]
    body: dict[str, Any]
    received: float
    answered: float | None = None
    cancelled: bool = False


@dataclass
class FakeEngine:
    """An aiohttp server answering like vLLM's OpenAI API, with fault knobs.

    ``events`` is shared between engines of one test so the order of upstream requests is observable.
    """

    role: str  # "P", "D" or "E"
    events: list[str]
    handshake_port: int = 6301
    notify_port: int = 6105
    dp_size: int = 1
    tp_size: int = 4
    # behaviour
    status: int = 200
    null_params: bool = False
    null_params_finish: str = "stop"  # with null_params: stop (a grammar left only a stop token), abort
    prefill_gate: asyncio.Event | None = None  # P waits for it before answering
    prefill_delay: float = 0.0
    chunks: int = 5
    chunk_interval: float = 0.0
    die_after: int | None = None  # close the connection abruptly after this many chunks
    hang: bool = False  # never answer
    first_chunk_delay: float = 0.0
    # a stream that vLLM 0.31 fails before its first token (a failed KV load): chat's role chunk, the usage
    # chunk when asked for, [DONE]; neither a token nor an error event
    fail_before_token: bool = False
    # answered when asked (return_token_ids): whole, or one a chunk in a stream (a stream's first chunk
    # with the prompt's, as vLLM 0.31's completions)
    token_ids: list[int] = field(default_factory=lambda: [11, 12, 13])
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    # stream as the simulator's model does: max_tokens tokens, each a function of the context (prompt + the
    # tokens before), so a continuation from a prompt plus the first tokens streams the rest
    model: bool = False
    # usage with prompt_tokens_details {"cached_tokens": N} (vLLM's --enable-prompt-tokens-details): in
    # prefill's answer, whole answers, and a final usage chunk when the stream asks for include_usage
    cached_tokens: int | None = None
    # observations
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def g2_registration(self, mode: str = "WRITE") -> dict[str, Any]:
        """docs/protocol.md#registration-g2, literally."""
        return {
            "type": self.role,
            "http_address": self.http_address,
            "zmq_address": f"host:127.0.0.1,handshake:{self.handshake_port},notify:{self.notify_port}",
            "dp_size": self.dp_size,
            "tp_size": self.tp_size,
            "transfer_mode": mode,
        }

    def g1_registration(self, mode: str = "WRITE", index: int = 0) -> dict[str, Any]:
        """docs/protocol.md#registration-g1, literally."""
        return {
            "type": "register",
            "role": self.role,
            "index": str(index),
            "request_address": f"http://{self.http_address}/v1/completions",
            "handshake_port": self.handshake_port,
            "notify_port": self.notify_port,
            "dp_size": self.dp_size,
            "tp_size": self.tp_size,
            "transfer_mode": mode,
        }

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        sock = bound_socket()
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0+rocm723" if self.role == "P" else "0.33.0"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        record = Recorded(request.path, CIMultiDict(request.headers), body, time.monotonic())
        self.requests.append(record)
        self.events.append(f"{self.role}:recv")
        try:
            return await self._answer(request, record)
        except asyncio.CancelledError:
            record.cancelled = True
            self.events.append(f"{self.role}:cancelled")
            raise

    async def _answer(self, request: web.Request, record: Recorded) -> web.StreamResponse:
        if self.hang:
            await asyncio.sleep(3600)
        if self.status != 200:
            self.events.append(f"{self.role}:done")
            return web.json_response(
                {"error": {"message": "engine failure", "type": "BadRequestError", "param": None, "code": self.status}},
                status=self.status,
            )
        request_id = request.headers.get("X-Request-Id", "none")
        if self.role == "P" and "kv_transfer_params" in record.body:
            return await self._prefill_answer(record, request_id)
        if record.body.get("stream"):
            return await self._stream(request, record, request_id)
        await asyncio.sleep(self.first_chunk_delay)
        record.answered = time.monotonic()
        self.events.append(f"{self.role}:done")
        choice: dict[str, Any] = {"text": "hi"}
        if record.body.get("return_token_ids"):
            choice["token_ids"] = self.token_ids
        answer: dict[str, Any] = {
            "id": f"cmpl-{request_id}-0-0a1b2c3d",
            "object": "text_completion",
            "choices": [choice],
        }
        if self.cached_tokens is not None:
            answer["usage"] = self._usage(1)
        return web.json_response(answer)

    def _usage(self, completion_tokens: int, prompt_tokens: int = 5) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    async def _prefill_answer(self, record: Recorded, request_id: str) -> web.Response:
        if self.prefill_gate is not None:
            await asyncio.wait_for(self.prefill_gate.wait(), timeout=10)
        await asyncio.sleep(self.prefill_delay)
        params = record.body.get("kv_transfer_params") or {}
        returned = None
        if not self.null_params:
            # docs/protocol.md#prefill-answer (G2): ports as strings, as extra_config often gives them.
            returned = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [1, 2, 3],
                "remote_engine_id": f"127.0.0.1:{self.handshake_port}",
                "remote_host": "127.0.0.1",
                "remote_handshake_port": str(self.handshake_port),
                "remote_notify_port": str(self.notify_port),
                "remote_dp_size": self.dp_size,
                "tp_size": self.tp_size,
                "transfer_id": params.get("transfer_id"),
            }
        record.answered = time.monotonic()
        self.events.append("P:done")
        return web.json_response(
            {
                "id": f"cmpl-{request_id}-0-11223344",
                "object": "text_completion",
                "created": 1700000000,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "text": "x",
                        "logprobs": None,
                        "finish_reason": "length" if returned else self.null_params_finish,
                        "stop_reason": None,
                    }
                ],
                "usage": self._usage(1),
                "kv_transfer_params": returned,
            }
        )

    async def _stream(self, request: web.Request, record: Recorded, request_id: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.first_chunk_delay)
        chat = request.path.endswith("/chat/completions")
        if self.fail_before_token and chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            chunk = {"id": f"chatcmpl-{request_id}", "choices": [role]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        prompt_ids, token_ids, texts = self._output(record.body, chat)
        for index in range(0 if self.fail_before_token else len(token_ids)):
            if self.die_after is not None and index == self.die_after:
                assert request.transport is not None
                request.transport.abort()
                self.events.append(f"{self.role}:died")
                return response
            output = {"delta": {"content": texts[index]}} if chat else {"text": texts[index]}
            if record.body.get("return_token_ids"):  # the answer's token_ids, one a chunk
                output["token_ids"] = token_ids[index]
                if index == 0:
                    output["prompt_token_ids"] = prompt_ids
            chunk = {"id": f"cmpl-{request_id}-0-0a1b2c3d", "choices": [{"index": 0, **output}]}
            if self.model:
                chunk["created"] = 1700000000
                chunk["choices"][0]["finish_reason"] = "length" if index == len(token_ids) - 1 else None
            await response.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
            if self.chunk_interval:
                await asyncio.sleep(self.chunk_interval)
        usage_asked = (record.body.get("stream_options") or {}).get("include_usage")
        if (self.cached_tokens is not None or self.fail_before_token or self.model) and usage_asked:
            usage = self._usage(len(token_ids), len(prompt_ids) if self.model else 5)
            chunk = {"id": f"cmpl-{request_id}-0-0a1b2c3d", "choices": [], "usage": usage}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        record.answered = time.monotonic()
        self.events.append(f"{self.role}:done")
        return response

    def _output(self, body: dict[str, Any], chat: bool) -> tuple[list[int], list[list[int]], list[str]]:
        """The prompt's token ids, each chunk's token ids and its text."""
        if not self.model:
            ids = [self.token_ids[i : i + 1] for i in range(self.chunks)]
            return self.prompt_token_ids, ids, [f"t{i}" for i in range(self.chunks)]
        parsed = openai.parse_request(body, chat, 1 << 20)
        kv = openai.KvCache.of_prompt(parsed.prompt_ids)
        tokens = [kv.token_id(i) for i in range(1, parsed.max_tokens + 1)]
        return list(parsed.prompt_ids), [[t] for t in tokens], [openai.token_text(t) for t in tokens]


class Registrar:
    """Real ZMQ DEALERs, one per engine as vLLM opens them (docs/protocol.md#registration-socket): the proxy
    shuts down a connection whose frame it refuses, which then takes only that engine's beats with it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._context = zmq.asyncio.Context()
        self._sockets: dict[str, zmq.asyncio.Socket] = {}

    def _socket(self, engine: str) -> zmq.asyncio.Socket:
        if engine not in self._sockets:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.address)
            self._sockets[engine] = sock
        return self._sockets[engine]

    async def send(self, payload: Any) -> None:
        engine = payload.get("http_address") or payload.get("request_address") if isinstance(payload, dict) else None
        await self._socket(str(engine)).send(msgpack.packb(payload))

    async def send_raw(self, frames: list[bytes]) -> None:
        await self._socket("raw").send_multipart(frames)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close(0)
        self._context.term()


def proxy_config(**overrides: Any) -> ProxyConfig:
    settings: dict[str, Any] = {
        "port": 0,
        "admin_port": 0,
        "registration_address": f"tcp://127.0.0.1:{TEST_PORTS.port()}",
        "health_interval_s": 0.2,
    }
    settings.update(overrides)
    return ProxyConfig(**settings)


async def wait_for(predicate: Any, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def start_proxy(config: ProxyConfig) -> ProxyServer:
    server = ProxyServer(config)
    await server.start()
    return server
