"""Pure: prefill's own answer as the client's, when prefill's first token already ended the request.

vLLM's producer returns ``kv_transfer_params: null`` when the request finished with EOS or a stop
string (only a length-capped request keeps its blocks for a decode engine). Its one-token answer is
then the whole answer, and sending the request to decode instead is wrong on vLLM < 0.32/0.33, whose
decode side treats every request as a remote prefill (docs/proxy.md, "When prefill yields no KV").
"""

from __future__ import annotations

import json
from typing import Any

from pd_runtime.proxy.legs import ClientRequest


def finished_on_prefill(document: Any) -> bool:
    """True when prefill's answer is final: no kv_transfer_params and every choice stopped."""
    if not isinstance(document, dict) or document.get("kv_transfer_params") is not None:
        return False
    choices = document.get("choices")
    return (
        isinstance(choices, list)
        and bool(choices)
        and all(isinstance(c, dict) and c.get("finish_reason") == "stop" for c in choices)
    )


def final_answer_events(document: dict[str, Any], request: ClientRequest) -> bytes:
    """The same answer as the SSE stream vLLM would have sent: content chunks, the usage chunk when
    ``stream_options.include_usage`` asks for it (usage on every chunk with ``continuous_usage_stats``),
    then ``[DONE]``."""
    chat = request.endpoint == "chat/completions"
    options = request.body.get("stream_options") or {}
    usage = document.get("usage")
    envelope = {
        "id": document.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": document.get("created"),
        "model": document.get("model"),
    }
    chunks: list[dict[str, Any]] = []
    for choice in document.get("choices", []):
        if chat:
            chunks += _chat_chunks(choice)
        else:
            chunks.append({"choices": [{k: v for k, v in choice.items() if k != "prompt_logprobs"}]})
    events = []
    for chunk in chunks:
        event = {**envelope, **chunk}
        if options.get("continuous_usage_stats") and usage is not None:
            event["usage"] = usage
        events.append(event)
    if options.get("include_usage") and usage is not None:
        events.append({**envelope, "choices": [], "usage": usage})
    out = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
    return out + b"data: [DONE]\n\n"


def _chat_chunks(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's chat stream: a first delta with the role, then the content with the finish reason."""
    index = choice.get("index", 0)
    message = choice.get("message") or {}
    delta = {k: v for k, v in message.items() if k != "role" and v not in (None, [], "")}
    if isinstance(delta.get("tool_calls"), list):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    role = {"index": index, "delta": {"role": message.get("role", "assistant"), "content": ""}, "logprobs": None}
    last = {
        "index": index,
        "delta": delta,
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
        "stop_reason": choice.get("stop_reason"),
    }
    return [{"choices": [{**role, "finish_reason": None}]}, {"choices": [last]}]


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
