"""Pure: migration of a request in flight (docs/proxy.md, "Migration").

When a decode stream breaks after tokens reached the client, the request goes on as a new P/D request
whose prompt is the original prompt plus the tokens already streamed, as token ids, with what is left of
its token budget; the new stream is spliced onto the client's, so the client sees one response. Greedy
decoding continues exactly where it stopped: a model's next token is a function of the context.

Here: which requests can migrate (``trackable``), what a stream passed to the client (``StreamTokens``,
from the token ids vLLM returns with ``return_token_ids``), whether a failure migrates (``decide``), the
continuation (``continuation``) and the splice of its chunks (``Splice``). ``flows`` drives it.
"""

from __future__ import annotations

from _json import scanstring  # the C string scanner of json.decoder
from typing import Any, Literal

from pd_runtime.proxy.errors import LegFailure
from pd_runtime.proxy.jsoncodec import dumps, engine_loads
from pd_runtime.proxy.legs import ClientRequest
from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import release

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM 0.31's ``CompletionRequest.max_tokens`` default (completion/protocol.py)."""

Outcome = Literal["ok", "failed", "limit_reached", "no_instance", "unsupported"]
"""How one migration ended (``ok``: its stream completed; ``failed``: it failed too), or why a broken
stream was not migrated: the limit was used up, no other decode engine was routable (or known when the
request began, so its stream was not read), or the request cannot be continued exactly (``trackable``, or
nothing left to continue)."""

Decision = Literal["migrate", "limit_reached", "no_instance", "unsupported"]

_PROMPT_IDS = b'"prompt_token_ids":['
_TOKEN_IDS = b'"token_ids":['
_FINISHED = b'"finish_reason":"'
_TEXT = b'"text":"'
_JSON_EVENT = b"data: {"


def trackable(request: ClientRequest, limit: int) -> bool:
    """Whether a request can migrate, so its decode stream is read for its token ids: a streamed completion
    of one prompt with a migration limit. Not chat: the continuation is a token-id completion, and a chat
    answer's stream is shaped by the engine's chat serving (role chunk, reasoning and tool-call parsers)
    from the generated text, which the proxy would have to redo. Not with ``stop`` strings (vLLM holds
    back streamed text that may begin one, so text and tokens part at a break, and a stop string spanning
    the splice would pass unseen), ``echo`` or ``prompt_logprobs``, which answer about the prompt."""
    body = request.body
    return (
        limit > 0
        and request.endpoint == "completions"
        and request.stream
        and not body.get("stop")
        and not body.get("echo")
        and body.get("prompt_logprobs") is None
    )


def tracked_request(request: ClientRequest) -> ClientRequest:
    """The request as the engines get it while it is tracked: with ``return_token_ids`` (vLLM 0.31's
    completions: ``prompt_token_ids`` in the stream's first chunk, each chunk's delta ``token_ids``)."""
    return ClientRequest(request.endpoint, {**request.body, "return_token_ids": True}, request.trace)


class StreamTokens:
    """What the client got of one tracked response, across its migrations: the prompt's and the generated
    token ids, its text and whether it finished; ``feed`` sees every event on its way to the client
    and takes out the ids the client did not ask for (as vLLM answers without ``return_token_ids``: null)."""

    def __init__(self, request: ClientRequest) -> None:
        self.prompt_ids: list[int] | None = None
        self.token_ids: list[int] = []
        self.text: list[str] = []
        """The text the client got, chunk by chunk: a continuation's first text may repeat it (``Splice``)."""
        self.text_chars = 0
        """Characters of text streamed: where vLLM 0.31's next logprob ``text_offset`` would begin."""
        self.next_offset = 0
        """Where vLLM 0.32+'s next logprob ``text_offset`` would begin: the last one plus its token's length
        (from 0.32 the offsets count the reported tokens, which run ahead of text held back)."""
        self.finished = False
        self.head: dict[str, Any] | None = None
        """The response's ``id`` and ``created`` (its first chunk's): every continuation chunk gets them."""
        self.prompt_text = _prompt_text(request.body.get("prompt"))
        self._client_ids = request.body.get("return_token_ids") is True
        self._logprobs = request.body.get("logprobs") is not None

    def feed(self, data: bytes) -> bytes:
        """Whole SSE events (relay's ``IdRewriter`` hands on no partial one) as the client gets them."""
        # find, not in (here and in _event): bytes.__contains__ first takes its operand for an int, and
        # raising and clearing that TypeError cost about 2,500 instructions a test, on every tracked event
        if data.find(_TOKEN_IDS) < 0 and data.find(_FINISHED) < 0:
            return data
        return b"\n\n".join([self._event(event) for event in data.split(b"\n\n")])

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(_JSON_EVENT):
            return event
        if self.head is None:  # the stream's first event: its id, its creation time, the prompt's ids
            document = engine_loads(event[6:])
            self.head = {"id": document.get("id"), "created": document.get("created")}
            prompt = _first_choice(document).get("prompt_token_ids")
            self.prompt_ids = prompt if isinstance(prompt, list) else None
            if not self._client_ids:  # read above (orjson reads a long prompt's ids many times faster)
                event = _nulled(event, _PROMPT_IDS, event.find(_PROMPT_IDS))
        # every event's token ids and text are read where they are, not the event parsed whole (that
        # was a fifth of a relayed chunk's instructions)
        tokens, event = _take_ids(event, _TOKEN_IDS, self._client_ids)
        self.token_ids += tokens
        text = _text_of(event)
        if text:
            self.text.append(text)
            self.text_chars += len(text)
        self.finished = self.finished or event.find(_FINISHED) >= 0
        if self._logprobs:
            self.next_offset = _next_offset(_first_choice(engine_loads(event[6:])).get("logprobs"), self.next_offset)
        return event


def _first_choice(document: Any) -> dict[str, Any]:
    """A stream event's one choice (a tracked request has one prompt and one sequence); {} without one."""
    choices = document.get("choices") if isinstance(document, dict) else None
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}


def _take_ids(event: bytes, key: bytes, keep: bool) -> tuple[list[int], bytes]:
    """The id list under ``key`` in an event (compact JSON, as vLLM and the simulator write it; [] without
    one), and the event with that list kept or made null."""
    start = event.find(key)
    if start < 0:
        return [], event
    begin = start + len(key)
    end = event.index(b"]", begin)
    ids = [int(part) for part in event[begin:end].split(b",")] if end > begin else []
    return ids, event if keep else _nulled(event, key, start)


def _nulled(event: bytes, key: bytes, start: int) -> bytes:
    """The event with the list under ``key``, found at ``start`` (-1: none), made null: the bytes cut, not
    the document written again."""
    if start < 0:
        return event
    return b"".join((event[:start], key[:-1], b"null", event[event.index(b"]", start) + 1 :]))


def _text_of(event: bytes) -> str:
    """The text of an event's one choice ("" without one). No string value can hold the match (a JSON string
    escapes its quotes) and no object before the choice has the key; json's own string scanner reads it."""
    start = event.find(_TEXT)
    if start < 0:
        return ""
    return scanstring(event[start + len(_TEXT) :].decode(), 0)[0]


def _next_offset(logprobs: Any, current: int) -> int:
    """The offset after an event's last reported token (``current`` when it reports none)."""
    if not isinstance(logprobs, dict):
        return current
    offsets, tokens = logprobs.get("text_offset"), logprobs.get("tokens")
    if isinstance(offsets, list) and isinstance(tokens, list) and offsets and tokens:
        last_offset, last_token = offsets[-1], tokens[-1]
        if isinstance(last_offset, int) and isinstance(last_token, str):
            return last_offset + len(last_token)
    return current


def _prompt_text(prompt: Any) -> str | None:
    """A completion's one prompt as text (None: token ids)."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def decide(
    failure: LegFailure,
    request: ClientRequest,
    tokens: StreamTokens | None,
    streamed: bool,
    migrations: int,
    limit: int,
    alone: bool = False,
) -> Decision | None:
    """Whether a failed request migrates. None: not a broken decode stream after the client's stream began
    (before it, failover serves the request whole elsewhere); else migrate, or why not. ``alone``: the
    proxy knew no other decode engine when the request began, so its stream was not read."""
    if failure.leg != "decode" or not failure.engine_failed or not streamed:
        return None
    if migrations >= limit:
        return "limit_reached"
    if alone:
        return "no_instance"
    if tokens is None or tokens.prompt_ids is None or tokens.finished:
        return "unsupported"
    if remaining_budget(request.body, len(tokens.token_ids)) == 0:
        return "unsupported"
    return "migrate"


def remaining_budget(body: dict[str, Any], streamed: int) -> int | None:
    """Tokens the request may still generate (None: the engine's own limit, the client sent max_tokens null)."""
    limit = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    return None if limit is None else max(0, limit - streamed)


def continuation(request: ClientRequest, tokens: StreamTokens) -> ClientRequest:
    """The request that goes on from what the client got: the prompt's and the streamed token ids as its
    prompt, the rest of the budget and of ``min_tokens``, token ids returned (to migrate once more)."""
    assert tokens.prompt_ids is not None
    streamed = len(tokens.token_ids)
    body = {**request.body, "prompt": [*tokens.prompt_ids, *tokens.token_ids], "return_token_ids": True}
    body["max_tokens"] = remaining_budget(request.body, streamed)
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = max(0, body["min_tokens"] - streamed)
    return ClientRequest(request.endpoint, body, request.trace)


class Splice:
    """A continuation's events made the original response's: its id and creation time, no prompt token ids,
    usage counted against the client's prompt (the streamed tokens move from prompt to completion: the
    total stays), logprob text offsets counted on from where the original stream's next one would begin (by
    the rule of the engine's release), and its first text without the repeat of the prompt and the streamed
    text (``unrepeated``). Its ids and text are read into the same ``StreamTokens`` after that, so it can
    migrate in turn."""

    def __init__(self, tokens: StreamTokens, offsets_by_tokens: bool) -> None:
        self._tokens = tokens
        self._moved = len(tokens.token_ids)
        self._offsets_by_tokens = offsets_by_tokens
        self._shift = tokens.next_offset if offsets_by_tokens else tokens.text_chars
        self._first_text = True

    def feed(self, data: bytes) -> bytes:
        return b"\n\n".join([self._tokens.feed(self._event(event)) for event in data.split(b"\n\n")])

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(_JSON_EVENT):
            return event
        document = engine_loads(event[6:])
        if "error" in document:
            return event
        document.update({k: v for k, v in (self._tokens.head or {}).items() if v is not None})
        for choice in document.get("choices") or []:
            if choice.get("prompt_token_ids") is not None:
                choice["prompt_token_ids"] = None
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("text_offset"), list):
                logprobs["text_offset"] = [offset + self._shift for offset in logprobs["text_offset"]]
            if self._first_text and choice.get("text"):
                self._first_text = False
                text = choice["text"]
                choice["text"] = unrepeated(text, self._tokens)
                if not self._offsets_by_tokens:  # vLLM 0.31 counts the repeat into the offsets after it
                    self._shift -= len(text) - len(choice["text"])
        usage = document.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            usage["prompt_tokens"] -= self._moved
            usage["completion_tokens"] = (usage.get("completion_tokens") or 0) + self._moved
        return b"data: " + dumps(document)


def offsets_by_tokens(version: str | None) -> bool:
    """Whether the engine's release counts a stream's logprob ``text_offset`` by the reported tokens (0.32+)
    rather than by the text sent (0.31); an engine whose release is not known yet is taken for the pin's."""
    try:
        return release(version or PINNED_VLLM_VERSION).offsets_by_tokens
    except ValueError:
        return release(PINNED_VLLM_VERSION).offsets_by_tokens


def unrepeated(text: str, tokens: StreamTokens) -> str:
    """A continuation's first text without the prompt and the text streamed before it, when it repeats
    them. vLLM primes its detokenizer with the prompt's ids (tokenizers' ``DecodeStream(ids=...)``), and
    when they decode to text ending in U+FFFD (a character whose bytes the last ids only began: the break
    fell inside it) the stream keeps no prefix, so its first text is the whole prompt's and the streamed
    tokens' text before the new. Known only for a text prompt: the proxy has no tokenizer for ids."""
    if tokens.prompt_text is None:
        return text
    repeated = tokens.prompt_text + "".join(tokens.text)
    return text[len(repeated) :] if text.startswith(repeated) else text
