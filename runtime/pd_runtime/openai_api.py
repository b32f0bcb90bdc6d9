"""Pure: the OpenAI-compatible API as its clients read it: the two endpoints and their URLs, and a
streamed answer (incremental Server-Sent-Events decoding, the meaning of one chunk). The benchmark's
client and the proxy read streams alike with it."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


ENDPOINT_PATHS = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions"}


def endpoint_url(base_url: str, endpoint: Endpoint) -> str:
    """Accept a server root (http://h:8000), its /v1, or the full endpoint URL."""
    url = base_url.rstrip("/")
    path = ENDPOINT_PATHS[endpoint]
    if url.endswith(path):
        return url
    if url.endswith("/v1"):
        return url + path.removeprefix("/v1")
    return url + path


DONE = "[DONE]"


class SseDecoder:
    """Turns arbitrary byte chunks into complete ``data:`` payloads.

    Events may be split across reads or several may share one read; comment lines (``:``) and other
    fields are ignored; multi-line data is joined with newlines, as the SSE specification says.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        return [payload for event in events if (payload := _data_of(event)) is not None]

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are buffered (a truncated stream)."""
        return bool(self._buffer.strip())


def _data_of(event: bytes) -> str | None:
    lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines).decode() if lines else None


class ChunkInfo:
    """What one stream chunk tells the client. A plain class with slots, not a dataclass: the proxy reads
    one per decode stream's opening chunk, and mypyc compiles a plain class's ``__init__`` (a dataclass's
    generated one stays interpreted)."""

    __slots__ = ("carries_token", "completion_tokens", "error", "prompt_tokens")

    def __init__(
        self,
        carries_token: bool,
        completion_tokens: int | None = None,
        prompt_tokens: int | None = None,
        error: str | None = None,
    ) -> None:
        self.carries_token = carries_token
        self.completion_tokens = completion_tokens
        self.prompt_tokens = prompt_tokens
        self.error = error

    def _fields(self) -> tuple[bool, int | None, int | None, str | None]:
        return (self.carries_token, self.completion_tokens, self.prompt_tokens, self.error)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkInfo) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        carries, completion, prompt, error = self._fields()
        return (
            f"ChunkInfo(carries_token={carries!r}, completion_tokens={completion!r}, "
            f"prompt_tokens={prompt!r}, error={error!r})"
        )


def interpret(chunk: Any, endpoint: Endpoint) -> ChunkInfo:
    """A chunk carries a token if its first choice has output: completions ``text`` (even empty: a
    token may decode to no text yet, and vLLM sends no empty chunk before the first token) or
    ``token_ids``; chat ``delta`` content, reasoning or tool calls (a role-only chat delta is not a
    token). A usage-only chunk (``choices: []``) carries none."""
    if not isinstance(chunk, dict):
        return ChunkInfo(carries_token=False, error="stream: chunk is not a JSON object")
    if "error" in chunk:
        return ChunkInfo(carries_token=False, error=f"stream_error: {_error_message(chunk['error'])}")
    usage = chunk.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return ChunkInfo(
        carries_token=_has_output(chunk.get("choices"), endpoint),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
    )


def _has_output(choices: Any, endpoint: Endpoint) -> bool:
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if endpoint is Endpoint.COMPLETIONS:
        return "text" in choice or bool(choice.get("token_ids"))
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return any(delta.get(key) for key in ("content", "reasoning_content", "reasoning", "tool_calls"))


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(error)[:200]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
