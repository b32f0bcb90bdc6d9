"""Pure: OpenAI request parsing and response bodies, in vLLM's shapes.

Token counting: token-id prompts count exactly (one id = one token). Text has no tokenizer here, so it
is approximated the way BPE vocabularies behave on ordinary text: a run of letters costs one token per
started 8 letters, a run of digits one per started 3 digits (Qwen splits numbers finely), and every
other non-space character one token. Chat adds 5 tokens per message (role markers) plus 3 for the
assistant prompt, like Qwen's chat template.

Generated tokens are greedy and deterministic, and follow from the context as a model's do: each token
id is a function of the prompt's token ids and the tokens generated before it (``KvCache``), so one engine
computing a request whole, a P->D pair whose decode engine got the right KV, and a request whose prompt
is another's prompt plus the tokens it had generated (a migrated request, docs/proxy.md "Migration")
answer the same ids; a decode engine whose KV is wrong answers others.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from pd_runtime.prefix_cache import id_blocks, piece_blocks

_PIECE_RE = re.compile(r"[^\W\d_]+|\d+|[^\w\s]|_")
_WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".")
CHAT_MESSAGE_OVERHEAD = 5
CHAT_PROMPT_OVERHEAD = 3
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
VOCAB_SIZE = 32000
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default (config/model.py, 0.31)
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily


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
    prompt_blocks: tuple[int, ...] = ()
    """The hashes of the prompt's full blocks, for the prefix cache (``prefix_cache``)."""
    return_token_ids: bool = False
    """vLLM's ``return_token_ids``: the answer carries the generated ``token_ids``."""
    logprobs: int | None = None
    """Top logprobs per token (completions ``logprobs``, chat ``top_logprobs`` with ``logprobs: true``);
    None: no logprobs in the answer."""
    tokens_as_ids: bool = False
    """vLLM's ``return_tokens_as_token_ids``: logprob tokens are ``token_id:N``."""
    stop: tuple[str, ...] = ()
    """Stop strings: the output ends before the first one it contains (``finish_reason: "stop"``)."""
    stop_token_ids: frozenset[int] = frozenset()
    """Stop tokens: the output ends with the first of them (its text left out, as vLLM does)."""
    prompt_ids: tuple[int, ...] = ()
    """The prompt's token ids: a token-id prompt's own, else ids drawn from the prompt (no tokenizer)."""


def _piece_tokens(piece: str) -> int:
    if piece[0].isdigit():
        return math.ceil(len(piece) / 3)
    if piece[0].isalpha():
        return math.ceil(len(piece) / 8)
    return 1


def text_pieces(text: str) -> list[tuple[str, int]]:
    """The text cut as the simulator counts tokens: each piece with its tokens."""
    return [(piece, _piece_tokens(piece)) for piece in _PIECE_RE.findall(text)]


def count_text_tokens(text: str) -> int:
    return sum(_piece_tokens(piece) for piece in _PIECE_RE.findall(text))


def _hash_token(seed: str, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}#{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % VOCAB_SIZE


_MASK64 = (1 << 64) - 1
_EMPTY_CONTEXT = 0x243F6A8885A308D3
_TOKEN_SALT = 0x13198A2E03707344
_EOS_SALT = 0xA4093822299F31D0
_CORRUPT_SALT = 0x082EFA98EC4E6C89


def _mix(value: int) -> int:
    """splitmix64's finalizer: 64 well-mixed bits from 64 (cheap enough for every token of a prompt)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def extend_context(context: int, token_ids: Iterable[int]) -> int:
    """The context after ``token_ids`` more tokens: a chain over every token, so equal token sequences (a
    prompt, or a shorter prompt plus what was generated from it) give equal contexts."""
    for token in token_ids:
        context = _mix(context ^ ((token + 1) * 0x9E3779B97F4A7C15 & _MASK64))
    return context


@dataclass(frozen=True)
class KvCache:
    """The KV a sequence decodes from: the prompt's context (``extend_context`` over its token ids), intact
    or not.

    Greedy decoding over intact KV yields the token the context gives, appends it and goes on, as a model
    does; over corrupted KV (a broken transfer, or a decode engine that never loaded the prompt) every token
    is another one, as a real model's logits over garbage attention keys and values would give. Where the
    output ends (``eos_at``) follows the intact context, whatever the KV."""

    prompt_context: int
    corrupt: bool = False
    _contexts: list[int] = field(default_factory=list, compare=False, repr=False)
    """The context before each generated token, computed as far as asked."""

    @classmethod
    def of_prompt(cls, prompt_ids: Iterable[int], corrupt: bool = False) -> KvCache:
        return cls(extend_context(_EMPTY_CONTEXT, prompt_ids), corrupt)

    def context(self, index: int) -> int:
        """The context the index-th (from 1) generated token is decoded from: the prompt and the tokens before."""
        contexts = self._contexts
        if not contexts:
            contexts.append(self.prompt_context)
        while len(contexts) < index:
            last = contexts[-1]
            contexts.append(extend_context(last, (_mix(last ^ _TOKEN_SALT) % VOCAB_SIZE,)))
        return contexts[index - 1]

    def token_id(self, index: int) -> int:
        """The index-th (from 1) greedy token id after the prompt."""
        context = self.context(index)
        token = _mix(context ^ _TOKEN_SALT) % VOCAB_SIZE
        if not self.corrupt:
            return token
        return (token + 1 + _mix(context ^ _CORRUPT_SALT) % (VOCAB_SIZE - 1)) % VOCAB_SIZE

    def eos_at(self, index: int, mean_tokens: float) -> bool:
        """Whether the model ends its output with the index-th token, where outputs run ``mean_tokens`` on
        average: a draw from that token's context, so a continuation ends where the original would."""
        return _mix(self.context(index) ^ _EOS_SALT) < (1 << 64) / max(mean_tokens, 1.0)


def token_logprob(token_id: int, context: int) -> float:
    """The logprob of a token decoded from ``context`` (``KvCache.context``): equal wherever the same token
    follows the same context (plain, through P->D, or in a continuation), different (almost always) for
    another token."""
    return -(_mix(context ^ ((token_id + 1) * _TOKEN_SALT & _MASK64)) % 8192) / 1024


def token_text(token_id: int) -> str:
    """The text of a token id (a small vocabulary of filler words)."""
    return _WORDS[token_id % len(_WORDS)]


def _is_int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _prompt(body: dict[str, Any]) -> tuple[int, str, tuple[int, ...]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _is_int_list(prompt[0])):
        prompt = prompt[0]
    if isinstance(prompt, str):
        pieces = text_pieces(prompt)
        return sum(n for _, n in pieces), prompt, piece_blocks(pieces)
    if _is_int_list(prompt):
        return len(prompt), ",".join(map(str, prompt[:64])) + f"/{len(prompt)}", id_blocks(prompt)
    if isinstance(prompt, list) and prompt:
        raise RequestError(400, "the simulated engine serves one prompt per request", "prompt")
    raise RequestError(400, "prompt must be a string or a list of token ids", "prompt")


def _text_prompt(body: dict[str, Any]) -> bool:
    prompt = body.get("prompt")
    return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))


def _messages(body: dict[str, Any]) -> tuple[int, str, tuple[int, ...]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    total, texts, pieces = CHAT_PROMPT_OVERHEAD, [], []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, "every message needs a role", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text parts count
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise RequestError(400, "message content must be a string or a list of parts", "messages")
        text = content or ""
        own = text_pieces(text)
        pieces += [(message["role"], CHAT_MESSAGE_OVERHEAD), *own]
        total += CHAT_MESSAGE_OVERHEAD + sum(n for _, n in own)
        texts.append(f"{message['role']}:{text[:256]}")
    return total, "|".join(texts) + f"/{total}", piece_blocks(pieces)


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
    prompt_tokens, prompt_key, prompt_blocks = _messages(body) if chat else _prompt(body)
    if prompt_tokens < 1:
        raise RequestError(400, "the prompt is empty", "messages" if chat else "prompt")
    n = _int_field(body, "n", 1, 1)
    default = None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = _int_field(body, "max_tokens", default, -(2**63))
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens", None, -(2**63))
    _check_context_length(prompt_tokens, max_tokens or 0, max_model_len, text_prompt=chat or _text_prompt(body))
    if max_tokens is not None and max_tokens < 1:
        raise _validation_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
    if min_tokens > max_tokens:
        raise RequestError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    _check_sampling(body, n)
    logprobs = _logprobs(body, chat)
    stop, stop_token_ids = _stops(body)
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
        prompt_blocks=prompt_blocks,
        return_token_ids=body.get("return_token_ids") is True,
        logprobs=logprobs,
        tokens_as_ids=body.get("return_tokens_as_token_ids") is True,
        stop=stop,
        stop_token_ids=stop_token_ids,
        prompt_ids=_prompt_ids(body, chat, prompt_tokens, prompt_key),
    )


def _prompt_ids(body: dict[str, Any], chat: bool, count: int, key: str) -> tuple[int, ...]:
    prompt = None if chat else body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and _is_int_list(prompt[0]):
        prompt = prompt[0]
    if _is_int_list(prompt):
        return tuple(prompt)
    return tuple(_hash_token(f"{key}/prompt", i) for i in range(count))


def add_prompt_token_ids(payload: dict[str, Any], request: GenerationRequest) -> dict[str, Any]:
    """vLLM 0.31's ``prompt_token_ids`` with ``return_token_ids``: on the completion's choice, at the top of
    a chat answer (in a stream: its first chunk)."""
    if request.return_token_ids:
        target = payload if request.chat else payload["choices"][0]
        target["prompt_token_ids"] = list(request.prompt_ids)
    return payload


def _stops(body: dict[str, Any]) -> tuple[tuple[str, ...], frozenset[int]]:
    stop = body.get("stop")
    strings = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(strings, list) or not all(isinstance(x, str) for x in strings):
        raise RequestError(400, "stop must be a string or a list of strings", "stop")
    if any(not x for x in strings):
        raise RequestError(400, "stop cannot contain an empty string.")
    ids = body.get("stop_token_ids") or []
    if not _is_int_list(ids):
        raise RequestError(400, f"stop_token_ids must contain only integers, got {ids}.")
    return tuple(strings), frozenset(ids)


@dataclass(frozen=True)
class Stopped:
    """How a request's output ends (``stopped_output``)."""

    length: int
    finish: str
    texts: tuple[str, ...] | None = None
    """Each token's text when a stop cut the output (None: each token's own)."""
    reason: str | int | None = None
    """vLLM's ``stop_reason``: the stop string or stop token id that ended it."""


def stopped_output(request: GenerationRequest, kv: KvCache, length: int, finish: str) -> Stopped:
    """Where a stop string or stop token ends the output of ``length`` tokens decoded from ``kv``, as vLLM's
    stop checks do (not before ``min_tokens``): a stop token's text is left out (the token stays), and the
    text ends where the first stop string begins, also when it spans tokens."""
    if not request.stop and not request.stop_token_ids:
        return Stopped(length, finish)
    texts: list[str] = []
    for index in range(1, length + 1):
        token = kv.token_id(index)
        if index > request.min_tokens and token in request.stop_token_ids:
            return Stopped(index, "stop", (*texts, ""), token)
        texts.append(token_text(token))
        if index <= request.min_tokens:
            continue
        text = "".join(texts)
        start = len(text) - len(texts[-1])
        hits = [(pos, stop) for stop in request.stop if (pos := text.find(stop, max(0, start - len(stop) + 1))) >= 0]
        if hits:
            pos, stop = min(hits)
            return Stopped(index, "stop", _cut(texts, pos), stop)
    return Stopped(length, finish)


def _cut(texts: list[str], end: int) -> tuple[str, ...]:
    """The tokens' texts with everything from character ``end`` of their concatenation on left out."""
    out, seen = [], 0
    for text in texts:
        out.append(text[: max(0, end - seen)])
        seen += len(text)
    return tuple(out)


def _validation_error(message: str, param: str, value: Any = None) -> RequestError:
    """vLLM's ``VLLMValidationError`` as its API server answers it (vllm/exceptions.py, 0.31): 400
    ``BadRequestError``, ``param`` the parameter, the message followed by ``(parameter=P, value=V)``."""
    extras = f"parameter={param}" + ("" if value is None else f", value={value}")
    return RequestError(400, f"{message} ({extras})", param)


def _check_context_length(prompt_tokens: int, max_tokens: int, max_model_len: int, text_prompt: bool) -> None:
    """vLLM 0.31's length checks (renderers/params.py, ``TokenizeParams``): ``max_tokens`` above
    ``max_model_len``, then a prompt longer than ``max_model_len - max_tokens``. vLLM tokenizes a text
    prompt only up to one token past that limit, so it reports such a count as "at least"."""
    if max_tokens > max_model_len:
        raise _validation_error(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tokens,
        )
    max_input = max_model_len - max_tokens
    if prompt_tokens <= max_input:
        return
    count = min(prompt_tokens, max_input + 1) if text_prompt else prompt_tokens
    qualifier = "at least " if count == max_input + 1 else ""
    raise _validation_error(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{max_tokens} output tokens and your prompt contains {qualifier}{count} input tokens, "
        f"for a total of {qualifier}{count + max_tokens} tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens.",
        "input_tokens",
        count,
    )


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{name} must be a number", name)
    return float(value)


def _check_sampling(body: dict[str, Any], n: int | None) -> None:
    """The sampling parameters' ranges, with vLLM 0.31's messages (``SamplingParams._verify_args``; those
    without a ``parameter`` carry no suffix and no ``param``). The simulator then ignores them: it always
    decodes greedily, so it serves ``n=1`` only (vLLM refuses more only for greedy requests)."""
    temperature = _number(body, "temperature", 1.0)
    if n is not None and n != 1:
        if temperature < GREEDY_BELOW:
            raise RequestError(400, f"n must be 1 when using greedy sampling, got {n}.")
        raise RequestError(400, "the simulated engine supports n=1 only", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        penalty = _number(body, name, 0.0)
        if not -2.0 <= penalty <= 2.0:
            raise RequestError(400, f"{name} must be in [-2, 2], got {penalty}.")
    repetition = _number(body, "repetition_penalty", 1.0)
    if not math.isfinite(repetition):
        raise RequestError(400, f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition <= 0.0:
        raise RequestError(400, f"repetition_penalty must be greater than zero, got {repetition}.")
    if not math.isfinite(temperature):
        raise _validation_error(f"temperature must be a finite number, got {temperature}.", "temperature", temperature)
    if temperature < 0.0:
        raise _validation_error(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
    if temperature > 2.0:
        raise _validation_error(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise _validation_error(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    top_k = body.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k < -1:
        raise RequestError(400, f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    min_p = _number(body, "min_p", 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise RequestError(400, f"min_p must be in [0, 1], got {min_p}.")


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many top logprobs each token carries (None: no logprobs), refused as vLLM 0.31 refuses it
    (completion/protocol.py ``check_logprobs``, chat_completion/protocol.py, ``_validate_logprobs``)."""
    name = "top_logprobs" if chat else "logprobs"
    value = body.get(name)
    if chat and body.get("logprobs") is not True:
        if value is not None and (value == -1 or (isinstance(value, int) and value > 0)):
            raise _validation_error("when using `top_logprobs`, `logprobs` must be set to true.", name)
        return None
    if value is None:
        return 0 if chat else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _validation_error(f"`{name}` must be an integer.", name, value)
    if value < 0 and value != -1:
        raise _validation_error(f"`{name}` must be a positive value or -1.", name, value)
    wanted = VOCAB_SIZE if value == -1 else value
    if wanted > MAX_LOGPROBS:
        raise _validation_error(
            f"Requested sample logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
            "logprobs",
            wanted,
        )
    return wanted


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
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    """The whole answer; ``token_ids`` only when the request asked (``return_token_ids``), on the choice
    as vLLM 0.31 puts them (``add_prompt_token_ids`` adds the prompt's)."""
    if env.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        if token_ids is not None:
            choice["token_ids"] = token_ids
        head = env._head("chat.completion")
    else:
        choice, head = _text_choice(text, finish_reason, token_ids, logprobs, stop_reason), env._head("text_completion")
    return {**head, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens), "kv_transfer_params": kv}


def _text_choice(
    text: str,
    finish_reason: str | None,
    token_ids: list[int] | None,
    logprobs: dict[str, Any] | None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
    return choice if token_ids is None else {**choice, "token_ids": token_ids}


def chunk(
    env: Envelope,
    text: str,
    finish_reason: str | None,
    first: bool,
    token_ids: list[int] | None = None,
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    """One stream chunk; ``token_ids`` (the chunk's delta tokens) and ``logprobs`` only when asked. A chat
    stream opens with a chunk of its own that carries only the role (``first``), as vLLM's does."""
    if env.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {**env._head("chat.completion.chunk"), "choices": [choice]}
    choice = _text_choice(text, finish_reason, token_ids, logprobs, stop_reason)
    return {**env._head("text_completion"), "choices": [choice]}


def logprobs_body(
    request: GenerationRequest, tokens: list[tuple[int, int]], text_offset: int = 0
) -> dict[str, Any] | None:
    """The ``logprobs`` of a choice (or a chunk) for its generated tokens, ``(context, token id)`` each, in
    vLLM's shapes: completions ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``, chat
    ``content`` entries. The greedy token heads each top list; the others are the next ids, less likely.
    None when the request asked for no logprobs."""
    if request.logprobs is None:
        return None

    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if request.tokens_as_ids else token_text(token_id)

    def top(context: int, token_id: int, count: int) -> list[tuple[str, float, str]]:
        ids = [(token_id + k) % VOCAB_SIZE for k in range(count)]
        return [(name(t), token_logprob(token_id, context) - k, token_text(t)) for k, t in enumerate(ids)]

    if request.chat:
        content = []
        for context, token_id in tokens:
            text = token_text(token_id)
            content.append(
                {
                    "token": name(token_id),
                    "logprob": token_logprob(token_id, context),
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": n, "logprob": lp, "bytes": list(t.encode())}
                        for n, lp, t in top(context, token_id, request.logprobs)
                    ],
                }
            )
        return {"content": content}
    # As vLLM 0.31 counts them: by each token's string (``token_id:N`` with return_tokens_as_token_ids);
    # a stream's chunk starts at the text sent so far (``text_offset``).
    offsets, offset = [], text_offset
    for _, token_id in tokens:
        offsets.append(offset)
        offset += len(name(token_id))
    return {
        "text_offset": offsets,
        "token_logprobs": [token_logprob(t, c) for c, t in tokens],
        "tokens": [name(t) for _, t in tokens],
        "top_logprobs": [{n: lp for n, lp, _ in top(c, t, max(request.logprobs, 1))} for c, t in tokens],
    }


def usage_chunk(env: Envelope, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if env.chat else "text_completion"
    return {**env._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
