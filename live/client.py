"""Requests to an engine or the proxy, and what the live tests compare: token ids and their logprobs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import requests

from live.cluster import MODEL_NAME, Pair
from pd_runtime.protocol import DEFAULT_DEFER_TIMEOUT_S

TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Generated:
    """One choice's output: token ids (vLLM's ``return_tokens_as_token_ids``), logprobs, finish reason."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    prompt_tokens: int | None = None  # from ``usage`` (plain answers)


def completion_body(prompt: str, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    return body | extra


def chat_body(content: str, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    return body | extra


def _token_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token.removeprefix("token_id:"))


def _choice_tokens(choice: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """Token ids, logprobs and text of one (whole or streamed-chunk) choice, completions or chat."""
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat
        entries = logprobs["content"] or []
        ids = [_token_id(e["token"]) for e in entries]
        lps = [e["logprob"] for e in entries]
        text = (choice.get("message") or choice.get("delta") or {}).get("content") or ""
    else:
        ids = [_token_id(t) for t in logprobs.get("tokens") or []]
        lps = list(logprobs.get("token_logprobs") or [])
        text = choice.get("text") or ""
    return ids, lps, text


def post(url: str, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, timeout=TIMEOUT_S)


def generate(url: str, path: str, body: dict[str, Any]) -> Generated:
    """One request, plain or streamed (``body["stream"]``); streamed chunks are joined in order."""
    if not body.get("stream"):
        resp = post(url, path, body)
        assert resp.status_code == 200, resp.text
        document = resp.json()
        choice = document["choices"][0]
        ids, lps, text = _choice_tokens(choice)
        return Generated(ids, lps, text, choice.get("finish_reason"), document["usage"]["prompt_tokens"])
    ids, lps, texts, finish = [], [], [], None
    with requests.post(f"{url}{path}", json=body, timeout=TIMEOUT_S, stream=True) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix(b"data: "))
            for choice in chunk.get("choices", []):
                i, lp, t = _choice_tokens(choice)
                ids += i
                lps += lp
                texts.append(t)
                finish = choice.get("finish_reason") or finish
    return Generated(ids, lps, "".join(texts), finish)


def reap_expired_send(pair: Pair, prompt: str) -> None:
    """Read mode, a send no decode will release: prefill reaps it past ``defer_timeout`` at its next scheduler
    step with KV connector output, which the tier's ``uni`` executor gives an idle engine only with a request
    (docs/vllm-versions.md#deferred-send-reaping). Waits past the timeout and sends prefill one."""
    time.sleep(DEFAULT_DEFER_TIMEOUT_S + 1)
    assert generate(pair.prefill.url, "/v1/completions", completion_body(prompt, max_tokens=1)).token_ids
