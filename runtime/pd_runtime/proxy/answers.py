"""Pure: the client's answer from decode's, with prefill's usage details (docs/proxy.md, "Usage")."""

from __future__ import annotations

import json
from typing import Any

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
