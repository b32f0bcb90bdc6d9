"""Pure: the client's answer from an engine's: the internal request id replaced by the client's, an
engine's error passed on or named, prefill's usage details merged (docs/proxy.md, "Usage"), a decode
stream that ends before any output told apart, and a whole answer assembled from a stream
(docs/proxy.md, "Waiting for the KV")."""

from __future__ import annotations

import json
from typing import Any

from pd_runtime.openai_api import DONE, Endpoint, SseDecoder, interpret
from pd_runtime.proxy.errors import ApiError
from pd_runtime.proxy.legs import ClientRequest

# ---------------------------------------------------------------------------------------------
# Response ids
# ---------------------------------------------------------------------------------------------


class IdRewriter:
    """Replaces the internal X-Request-Id (which carries engine addresses, docs/protocol.md#toy-proxy) with the uid.

    For streams it rewrites only complete SSE events and holds back a partial one, so an id split
    across two reads is still replaced; reads from vLLM end on event boundaries, so nothing waits.
    """

    def __init__(self, internal_id: str, public_id: str) -> None:
        self._internal = internal_id.encode()
        self._public = public_id.encode()
        self._active = internal_id != public_id
        self._pending = b""

    def whole(self, body: bytes) -> bytes:
        return body.replace(self._internal, self._public) if self._active else body

    def feed(self, data: bytes) -> bytes:
        if not self._active:
            return data
        if not self._pending and data.endswith(b"\n\n"):  # what vLLM's reads are: whole events
            return data.replace(self._internal, self._public)
        if self._pending:
            data = self._pending + data
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + 2 :]
        return data[: end + 2].replace(self._internal, self._public)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest.replace(self._internal, self._public)


def upstream_error_for_client(status: int, body: bytes, leg: str, rewriter: IdRewriter) -> ApiError:
    """What a failed leg means for the client: an engine 4xx is about the request and passes through
    (its body, ids rewritten); anything else is a 502 that names the leg, never the engine's text."""
    if 400 <= status < 500:
        return ApiError(status, f"{leg} engine rejected the request", raw_body=rewriter.whole(body))
    return ApiError(502, f"{leg} engine answered HTTP {status}", type="upstream_error", code=f"{leg}_failed")


# ---------------------------------------------------------------------------------------------
# A decode stream's opening (docs/proxy.md, "Errors")
# ---------------------------------------------------------------------------------------------


def opens_answer(events: bytes, request: ClientRequest) -> bool:
    """Whether whole SSE events at the start of a decode stream begin the answer: a chunk with output
    (a token, even one without text yet, or a finish reason) or an error event (vLLM's own, passed on).
    Chat's role chunk, a usage chunk and ``[DONE]`` do not.

    vLLM 0.31 ends a stream that failed before its first token (finish reason ``error``, e.g. a failed KV
    load with ``kv_load_failure_policy=fail``) with only those: its stream generators skip an output with
    neither token nor text before they look at its finish reason (``completion_stream_generator``,
    ``chat_completion_stream_generator``: "Chunked prefill case, don't return empty chunks"), so the
    client would get HTTP 200 and an empty answer."""
    return chunks_open_answer(stream_chunks(events), request)


def chunks_open_answer(chunks: list[Any], request: ClientRequest) -> bool:
    """``opens_answer`` over chunks already parsed (``stream_chunks``)."""
    endpoint = Endpoint.CHAT if request.endpoint == "chat/completions" else Endpoint.COMPLETIONS
    for chunk in chunks:
        if isinstance(chunk, str):
            return True  # not ours to judge: the client gets decode's bytes
        info = interpret(chunk, endpoint)
        if info.carries_token or info.error is not None or _finishes(chunk):
            return True
    return False


def stream_chunks(events: bytes) -> list[Any]:
    """The JSON chunks of whole SSE events, ``[DONE]`` left out (a chunk that is not JSON: its text)."""
    chunks = []
    for payload in SseDecoder().feed(events):
        if payload == DONE:
            continue
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            chunks.append(payload)
    return chunks


def whole_from_stream(chunks: list[Any], request: ClientRequest) -> dict[str, Any]:
    """The whole answer vLLM sends for a request that was not streamed, from the chunks of the same
    request streamed with ``stream_options.include_usage`` (legs.streams_whole): the envelope of the first
    chunk; one choice (the proxy serves ``n`` = 1) with the text or message joined, logprobs and token ids
    joined, the last finish and stop reason; the usage chunk's usage. vLLM 0.31's stream and whole answers
    are built from the same outputs (``OpenAIServingCompletion``, ``OpenAIServingChat``)."""
    chat = request.endpoint == "chat/completions"
    objects = [c for c in chunks if isinstance(c, dict)]
    answer: dict[str, Any] = {
        k: v for k, v in (objects[0] if objects else {}).items() if k not in ("choices", "usage", "object")
    }
    answer["object"] = "chat.completion" if chat else "text_completion"
    parts = [c for chunk in objects for c in chunk.get("choices") or [] if isinstance(c, dict)]
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = _joined_message([p.get("delta") or {} for p in parts])
    else:
        choice["text"] = "".join(p.get("text") or "" for p in parts)
    logprobs = [p["logprobs"] for p in parts if isinstance(p.get("logprobs"), dict)]
    choice["logprobs"] = _joined_logprobs(logprobs, chat) if logprobs else None
    finished = [p for p in parts if p.get("finish_reason") is not None]
    choice["finish_reason"] = finished[-1]["finish_reason"] if finished else None
    choice["stop_reason"] = finished[-1].get("stop_reason") if finished else None
    if any(p.get("token_ids") is not None for p in parts):
        choice["token_ids"] = [t for p in parts for t in p.get("token_ids") or []]
    prompt_ids = [p["prompt_token_ids"] for p in parts if p.get("prompt_token_ids") is not None]
    if prompt_ids:
        choice["prompt_token_ids"] = prompt_ids[0]
    answer["choices"] = [choice]
    usage = [c["usage"] for c in objects if isinstance(c.get("usage"), dict)]
    if usage:
        answer["usage"] = usage[-1]
    return answer


def _joined_message(deltas: list[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        for key, value in delta.items():
            if key == "role":
                message["role"] = value
            elif isinstance(value, str):
                message[key] = (message.get(key) or "") + value
            elif value is not None:
                message[key] = value
    return message


def _joined_logprobs(logprobs: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    keys = ("content",) if chat else ("text_offset", "token_logprobs", "tokens", "top_logprobs")
    joined = {key: [entry for lp in logprobs for entry in lp.get(key) or []] for key in keys}
    if not chat and joined["text_offset"]:
        # vLLM's whole answer counts each offset on from the previous token's string (a "token_id:N" with
        # return_tokens_as_token_ids), a stream's chunk from the text sent so far
        # (OpenAIServingCompletion._create_completion_logprobs): the whole answer's offsets, recounted.
        offsets = [joined["text_offset"][0]]
        for token in joined["tokens"][:-1]:
            offsets.append(offsets[-1] + len(token if isinstance(token, str) else ""))
        joined["text_offset"] = offsets
    return joined


def _finishes(chunk: Any) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


# ---------------------------------------------------------------------------------------------
# Usage reconciliation (docs/proxy.md, "Usage")
# ---------------------------------------------------------------------------------------------

_USAGE_MARK = b'"prompt_tokens"'  # in a usage object only: the cheap test before any JSON is parsed


def prompt_details(document: Any) -> dict[str, Any] | None:
    """Prefill's ``usage.prompt_tokens_details`` (vLLM's PromptTokenUsageInfo: ``cached_tokens``, the
    client's prefix-cache hit), or None when prefill reported none (vLLM's --enable-prompt-tokens-details off)."""
    usage = document.get("usage") if isinstance(document, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return details if isinstance(details, dict) else None


def _with_details(document: Any, details: dict[str, Any]) -> bool:
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return False
    usage["prompt_tokens_details"] = details
    return True


def merge_usage(body: bytes, details: dict[str, Any]) -> bytes:
    """Decode's whole answer with prefill's prompt_tokens_details in its usage; unchanged without usage."""
    if _USAGE_MARK not in body:
        return body
    try:
        document = json.loads(body)
    except ValueError:
        return body  # not ours to judge: the client gets decode's bytes
    return json.dumps(document, separators=(",", ":")).encode() if _with_details(document, details) else body


def merge_usage_events(data: bytes, details: dict[str, Any]) -> bytes:
    """Whole SSE events (what IdRewriter hands on) with prefill's prompt_tokens_details in each usage:
    the final usage chunk of ``stream_options.include_usage``, every chunk with continuous_usage_stats."""
    if _USAGE_MARK not in data:
        return data
    events = data.split(b"\n\n")
    for index, event in enumerate(events):
        if event.startswith(b"data: ") and _USAGE_MARK in event:
            events[index] = b"data: " + merge_usage(event[6:], details)
    return b"\n\n".join(events)
