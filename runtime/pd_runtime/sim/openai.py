"""Pure: OpenAI request parsing and response bodies, in vLLM's shapes.

Token counting: token-id prompts count exactly (one id = one token). Text has no tokenizer here, so it
is approximated the way BPE vocabularies behave on ordinary text: a run of letters costs one token per
started 8 letters, a run of digits one per started 3 digits (Qwen splits numbers finely), and every
other non-space character one token. Chat adds 5 tokens per message (role markers) plus 3 for the
assistant prompt, like Qwen's chat template.

Generated tokens are greedy and deterministic: the i-th token id is a hash of the prompt's KV (a digest
of the prompt) and i, so one engine computing a request whole and a P->D pair whose decode engine got
the right KV answer the same ids, and a decode engine whose KV is wrong answers others (``KvCache``).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

_PIECE_RE = re.compile(r"[^\W\d_]+|\d+|[^\w\s]|_")
_WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".")
CHAT_MESSAGE_OVERHEAD = 5
CHAT_PROMPT_OVERHEAD = 3
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
VOCAB_SIZE = 32000


class RequestError(Exception):
    """A request the engine refuses, with vLLM's status and error type."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or ("NotFoundError" if status == 404 else "BadRequestError")


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool
    model: str | None
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: dict[str, Any] | None
    prompt_key: str
    """A digest of the prompt: where EOS falls is drawn from it, so P and D of one request agree."""
    return_token_ids: bool = False
    """vLLM's ``return_token_ids``: the answer carries the generated ``token_ids``."""


def count_text_tokens(text: str) -> int:
    total = 0
    for piece in _PIECE_RE.findall(text):
        if piece[0].isdigit():
            total += math.ceil(len(piece) / 3)
        elif piece[0].isalpha():
            total += math.ceil(len(piece) / 8)
        else:
            total += 1
    return total


def _hash_token(seed: str, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}#{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % VOCAB_SIZE


@dataclass(frozen=True)
class KvCache:
    """The KV a sequence decodes from: the prompt's (``seed``, a digest of it), intact or not.

    Greedy decoding over intact KV yields ``_hash_token(seed, i)``; over corrupted KV (a broken transfer,
    or a decode engine that never loaded the prompt) every token is another one, as a real model's
    logits over garbage attention keys and values would give."""

    seed: str
    corrupt: bool = False

    @classmethod
    def of_prompt(cls, prompt_key: str, corrupt: bool = False) -> KvCache:
        return cls(hashlib.blake2b(prompt_key.encode(), digest_size=8).hexdigest(), corrupt)

    def token_id(self, index: int) -> int:
        """The index-th (from 1) greedy token id after the prompt."""
        token = _hash_token(self.seed, index)
        if not self.corrupt:
            return token
        return (token + 1 + _hash_token(self.seed + "/corrupt", index) % (VOCAB_SIZE - 1)) % VOCAB_SIZE


def token_text(token_id: int) -> str:
    """The text of a token id (a small vocabulary of filler words)."""
    return _WORDS[token_id % len(_WORDS)]


def _is_int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _prompt(body: dict[str, Any]) -> tuple[int, str]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _is_int_list(prompt[0])):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return count_text_tokens(prompt), prompt
    if _is_int_list(prompt):
        return len(prompt), ",".join(map(str, prompt[:64])) + f"/{len(prompt)}"
    if isinstance(prompt, list) and prompt:
        raise RequestError(400, "the simulated engine serves one prompt per request", "prompt")
    raise RequestError(400, "prompt must be a string or a list of token ids", "prompt")


def _messages(body: dict[str, Any]) -> tuple[int, str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    total, texts = CHAT_PROMPT_OVERHEAD, []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, "every message needs a role", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text parts count
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise RequestError(400, "message content must be a string or a list of parts", "messages")
        text = content or ""
        total += CHAT_MESSAGE_OVERHEAD + count_text_tokens(text)
        texts.append(f"{message['role']}:{text[:256]}")
    return total, "|".join(texts) + f"/{total}"


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(400, f"{name} must be an integer >= {minimum}", name)
    return value


def parse_request(body: Any, chat: bool, max_model_len: int) -> GenerationRequest:
    """Validate a /v1/completions or /v1/chat/completions body as vLLM would (the parts we model)."""
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    prompt_tokens, prompt_key = _messages(body) if chat else _prompt(body)
    if prompt_tokens < 1:
        raise RequestError(400, "the prompt is empty", "messages" if chat else "prompt")
    n = _int_field(body, "n", 1, 1)
    if n != 1:
        raise RequestError(400, "the simulated engine supports n=1 only", "n")
    default = None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = _int_field(body, "max_tokens", default, 1)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > max_model_len:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). "
            "Please reduce the length of the prompt or completion.",
            "max_tokens",
        )
    min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
    if min_tokens > max_tokens:
        raise RequestError(400, "min_tokens must be less than or equal to max_tokens", "min_tokens")
    stream = body.get("stream", False) is True
    options = body.get("stream_options")
    if options is not None and not stream:
        raise RequestError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, "stream_options must be an object", "stream_options")
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise RequestError(400, "kv_transfer_params must be an object", "kv_transfer_params")
    model = body.get("model")
    return GenerationRequest(
        chat=chat,
        model=model if isinstance(model, str) else None,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=body.get("ignore_eos", False) is True,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        continuous_usage=bool(options and options.get("continuous_usage_stats")),
        kv_transfer_params=params,
        prompt_key=prompt_key,
        return_token_ids=body.get("return_token_ids") is True,
    )


def response_id(chat: bool, x_request_id: str, suffix: str) -> str:
    """vLLM's ids: ``cmpl-<X-Request-Id>-0`` / ``chatcmpl-<X-Request-Id>``, plus ``-<8 hex>`` since #27987."""
    base = f"chatcmpl-{x_request_id}" if chat else f"cmpl-{x_request_id}-0"
    return f"{base}-{suffix}" if suffix else base


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


@dataclass(frozen=True)
class Envelope:
    """What every body and chunk of one response shares."""

    id: str
    model: str
    chat: bool
    created: int

    @classmethod
    def new(cls, rid: str, model: str, chat: bool) -> Envelope:
        return cls(rid, model, chat, int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def full_response(
    env: Envelope,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    kv: dict[str, Any] | None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """The whole answer; ``token_ids`` only when the request asked (``return_token_ids``), on the choice
    as vLLM 0.31 puts them (the simulator has no prompt ids: ``prompt_token_ids`` stays out)."""
    if env.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        if token_ids is not None:
            choice["token_ids"] = token_ids
        head = env._head("chat.completion")
    else:
        choice, head = _text_choice(text, finish_reason, token_ids), env._head("text_completion")
    return {**head, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens), "kv_transfer_params": kv}


def _text_choice(text: str, finish_reason: str | None, token_ids: list[int] | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
    return choice if token_ids is None else {**choice, "token_ids": token_ids}


def chunk(
    env: Envelope, text: str, finish_reason: str | None, first: bool, token_ids: list[int] | None = None
) -> dict[str, Any]:
    """One stream chunk; ``token_ids`` (the chunk's delta tokens) only when the request asked."""
    if env.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {**env._head("chat.completion.chunk"), "choices": [choice]}
    return {**env._head("text_completion"), "choices": [_text_choice(text, finish_reason, token_ids)]}


def usage_chunk(env: Envelope, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if env.chat else "text_completion"
    return {**env._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
