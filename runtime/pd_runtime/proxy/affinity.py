"""Pure: which instance a prompt's prefix belongs to, on a consistent-hash ring (``prefix_affinity``).

vLLM's prefix cache is per engine: a prompt whose first blocks an engine computed recently is served
from its cache (only the rest is computed). Sending prompts that share a beginning to the same prefill
engine raises that hit rate, and partitions the set of shared prefixes over the engines, so together
they cache more of them than each one caching all. The key is the prompt's beginning:

- a prompt of token ids: its first ``tokens`` ids, exactly what the cache's first blocks hold;
- a text prompt or chat messages: its first ``CHARS_PER_TOKEN * tokens`` characters (of the messages:
  role and content of each, in order). The proxy has no tokenizer (one per model, and tokenizing every
  prompt costs more CPU than the whole relay), and two prompts with the same first characters have the
  same first tokens; about 4 characters make a token for English text in common BPE tokenizers, so the
  key covers roughly the same prefix either way.

The ring: every instance at ``VNODES`` points (a stable 64-bit hash of its address and the point's
number, blake2b, the same in every proxy process: replicas behind a router agree), a key on the first
point at or after its hash. An instance joining takes about 1/k of the keys, all from the others; one
leaving hands only its own keys on.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Iterable
from typing import Any

CHARS_PER_TOKEN = 4
VNODES = 64


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text, in order
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _chat_text(messages: Iterable[Any], chars: int) -> str:
    parts, length = [], 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        part = f"{message.get('role')}\x00{_content_text(message.get('content'))}\x00"
        parts.append(part)
        length += len(part)
        if length >= chars:
            break
    return "".join(parts)[:chars]


def completion_prompt(body: dict[str, Any]) -> str | list[int] | None:
    """A completions body's one prompt, text or token ids; None for a batch, chat or no prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    return None


def chat_text(body: dict[str, Any], chars: int) -> str | None:
    """A chat body's messages as one text (role and content of each, in order), its first ``chars``
    characters; None without messages."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return _chat_text(messages, chars)
    return None


def prefix_key(body: dict[str, Any], tokens: int) -> bytes | None:
    """The key of a client body's prompt prefix (module docstring); None without a usable prompt."""
    chars = CHARS_PER_TOKEN * tokens
    prompt = completion_prompt(body)
    if isinstance(prompt, str):
        return b"text\x00" + prompt[:chars].encode()
    if prompt is not None:
        return b"ids\x00" + ",".join(map(str, prompt[:tokens])).encode()
    text = chat_text(body, chars)
    return None if text is None else b"chat\x00" + text.encode()


@functools.lru_cache(maxsize=16)
def _ring(members: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    points = sorted((_hash(f"{member}#{i}".encode()), member) for member in members for i in range(VNODES))
    return tuple(p for p, _ in points), tuple(m for _, m in points)


def owner(members: Iterable[str], key: bytes) -> str:
    """The member (an instance's address) whose ring point follows ``key``'s hash; ``members`` non-empty.
    The ring of one set of members is built once (cached), however they are ordered."""
    positions, owners = _ring(tuple(sorted(set(members))))
    return owners[bisect.bisect_left(positions, _hash(key)) % len(positions)]
