"""The OpenAI-compatible HTTP surface of the simulated engine (aiohttp), shaped like vLLM's."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pd_runtime.sim import openai
from pd_runtime.sim.engine import RequestHandle, SimEngine

log = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", SimEngine)
DP_RANK_HEADER = "X-data-parallel-rank"
# What vLLM's AuthenticationMiddleware guards when it has a key; /health and /metrics stay open.
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def _dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"))


def error_response(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    return web.json_response(openai.error_body(status, message, err_type, param), status=status, dumps=_dumps)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Nothing a client sends may crash the engine: every failure becomes an OpenAI-style error body."""
    engine = request.app[ENGINE_KEY]
    if engine.config.faults.unresponsive:
        await engine.stopping.wait()  # fault knob: registered, but never answers (until shutdown)
        return error_response(503, "engine is shutting down", "ServiceUnavailableError")
    if request.path.startswith(GUARDED_PREFIXES) and not _authorized(request, engine.config.api_keys):
        return web.json_response({"error": "Unauthorized"}, status=401)
    try:
        return await handler(request)
    except openai.RequestError as exc:
        return error_response(exc.status, exc.message, exc.err_type, exc.param)
    except web.HTTPException as exc:
        return error_response(exc.status, exc.reason, "NotFoundError" if exc.status == 404 else "BadRequestError")
    except Exception as exc:
        log.exception("request %s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(exc).__name__}", "InternalServerError")


def _authorized(request: web.Request, keys: tuple[str, ...]) -> bool:
    """vLLM's check: no keys, or ``Authorization: Bearer <one of them>`` (compared as digests)."""
    if not keys:
        return True
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    supplied = hashlib.sha256(token.encode()).digest()
    matches = [hmac.compare_digest(supplied, hashlib.sha256(key.encode()).digest()) for key in keys]
    return scheme.lower() == "bearer" and any(matches)


def _dp_rank(request: web.Request) -> int | None:
    raw = request.headers.get(DP_RANK_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise openai.RequestError(400, f"{DP_RANK_HEADER} must be an integer, got {raw!r}") from None


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise openai.RequestError(400, "request body is not valid JSON") from None


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    parsed = openai.parse_request(await _body(request), chat, engine.config.max_model_len)
    names = engine.config.served_model_names
    if parsed.model is not None and parsed.model not in names:
        raise openai.RequestError(404, f"The model `{parsed.model}` does not exist.", "model", "NotFoundError")
    handle = engine.open(parsed, request.headers.get("X-Request-Id"), _dp_rank(request))
    try:
        delay = engine.config.faults.first_byte_delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        envelope = openai.Envelope.new(handle.record.id, parsed.model or names[0], chat)
        if parsed.stream:
            return await _stream(request, handle, envelope, parsed)
        return await _complete(handle, envelope, parsed)
    finally:
        # A client gone before the first output (during the response head's write, or the fault's delay)
        # never starts ``outputs``, whose own close would abort the request: vLLM aborts it all the same.
        handle.close()


async def _complete(handle: RequestHandle, env: openai.Envelope, req: openai.GenerationRequest) -> web.Response:
    parts: list[str] = []
    tokens: list[tuple[int, int]] = []
    finish = "length"
    async for out in handle.outputs():
        parts.append(out.text)
        tokens.append((out.context, out.token_id))
        finish = out.finish_reason or finish
    body = openai.full_response(
        env,
        "".join(parts),
        finish,
        req.prompt_tokens,
        handle.record.completion_tokens,
        handle.kv_transfer_params,
        [t for _, t in tokens] if req.return_token_ids else None,
        openai.logprobs_body(req, tokens),
        handle.stop_reason if finish == "stop" else None,
    )
    openai.add_prompt_token_ids(body, req)
    return web.json_response(body, dumps=_dumps)


async def _stream(
    request: web.Request, handle: RequestHandle, env: openai.Envelope, req: openai.GenerationRequest
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(payload: Any) -> None:
        await response.write(f"data: {_dumps(payload)}\n\n".encode())

    offset = 0
    try:
        async for out in handle.outputs():
            if env.chat and out.index == 1:
                await send(openai.add_prompt_token_ids(openai.chunk(env, "", None, first=True), req))
            ids = [out.token_id] if req.return_token_ids else None
            logprobs = openai.logprobs_body(req, [(out.context, out.token_id)], offset)
            offset += len(out.text)
            stop_reason = handle.stop_reason if out.finish_reason == "stop" else None
            chunk = openai.chunk(env, out.text, out.finish_reason, False, ids, logprobs, stop_reason)
            if not env.chat and out.index == 1:
                openai.add_prompt_token_ids(chunk, req)
            if req.continuous_usage:
                chunk["usage"] = openai.usage(req.prompt_tokens, out.index)
            await send(chunk)
    except openai.RequestError as exc:
        # Before 0.32 vLLM's completions stream skips a choice that has neither text nor tokens yet before
        # it checks for a failed request (completion/serving.py, "don't return empty chunks"), so a request
        # whose KV failed to load before its first token ends with [DONE] alone: HTTP 200, no error.
        silent = not request.app[ENGINE_KEY].behaviour.release.streams_error_before_first_token
        if not (handle.kv_load_failed and not env.chat and silent):
            await send(openai.error_body(exc.status, exc.message, exc.err_type, exc.param))
    else:
        if req.include_usage:
            await send(openai.usage_chunk(env, req.prompt_tokens, handle.record.completion_tokens))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


DISCONNECT_POLL_S = 0.05


async def _until_disconnected(request: web.Request) -> None:
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _aborted_on_disconnect(request: web.Request, work: Awaitable[web.StreamResponse]) -> web.StreamResponse:
    """Race the request with its connection, as vLLM's API server does (``with_cancellation``).

    aiohttp's handler cancellation misses a client that leaves right after sending its request (before the
    handler runs), which left a decode request waiting for KV; watching the transport catches that too.
    """
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not handler.done():
            handler.cancel()
            await asyncio.wait({handler})
    if handler.cancelled():
        raise asyncio.CancelledError  # aiohttp drops the connection quietly, as on handler cancellation
    return handler.result()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _aborted_on_disconnect(request, _generate(request, chat=False))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _aborted_on_disconnect(request, _generate(request, chat=True))


async def health(request: web.Request) -> web.Response:
    """200, or 503 once an engine core has died (vLLM's ``/health`` on EngineDeadError)."""
    dead = [core.dead for core in request.app[ENGINE_KEY].cores if core.dead is not None]
    return web.Response(status=503, text="; ".join(dead)) if dead else web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    config = request.app[ENGINE_KEY].config
    created = int(time.time())
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": config.model,
            "parent": None,
            "max_model_len": config.max_model_len,
        }
        for name in config.served_model_names
    ]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[ENGINE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def debug_requests(request: web.Request) -> web.Response:
    """Server-side timestamps of recent requests (Unix seconds): lets a benchmark measure its own
    timing error against what the engine actually did."""
    engine = request.app[ENGINE_KEY]
    try:
        limit = int(request.query.get("limit", "1000"))
    except ValueError:
        raise openai.RequestError(400, "limit must be an integer", "limit") from None
    records = list(engine.records)[-max(limit, 0) :] if limit > 0 else []
    body = {
        "time_scale": engine.config.time_scale,
        "profile": engine.profile.name,
        "requests": [r.as_json() for r in records],
    }
    return web.json_response(body, dumps=_dumps)


async def version(request: web.Request) -> web.Response:
    """vLLM's /version, with the release the simulator reproduces (what the proxy reports as running)."""
    return web.json_response({"version": request.app[ENGINE_KEY].config.vllm_version})


def build_app(engine: SimEngine) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)
    app.router.add_get("/debug/requests", debug_requests)
    return app
