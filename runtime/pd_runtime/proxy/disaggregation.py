"""Pure: selective disaggregation, whether a request runs on prefill and decode or on decode alone
(docs/proxy.md, "Selective disaggregation").

Disaggregation buys decode streams that no prefill interrupts, at the price of a prefill leg, a KV
transfer and a longer TTFT. For a short prompt the price is all there is: decode computes a few hundred
tokens in one step, faster than the round trip and the transfer. So under ``threshold`` a prompt of
fewer than ``threshold`` tokens, or one whose part the decode engine has not cached is that short,
is one plain request to decode. Only for engines whose decode computes a plain request itself (vLLM
0.32 in write mode, 0.33 in both, ``sim.versions``); the operator refuses the policy for others.

How many tokens, without a tokenizer (one per model, and tokenizing costs more CPU than the relay):
a token-id prompt's length is exact; a text prompt or chat messages count 4 ASCII characters a token
(``affinity.CHARS_PER_TOKEN``; English prose runs 4-4.5 in common BPE tokenizers, code about 3) and
every other character a token (CJK text runs 1-1.5 characters a token), and the chat template's few
tokens per message are left out.

What decode has cached, without asking it: the proxy is the only client of its engines, so it knows
every prompt it sent each decode engine, prompts it disaggregated included (vLLM caches the blocks a
transfer delivered). ``DecodeCaches`` keeps their block hashes per engine as vLLM's prefix cache does
(``prefix_cache``: chained 16-token blocks, least recently used out past a size the proxy is told,
``--disaggregation-cache-tokens``). It is an estimate: the engine evicts under its own load, and a
restarted engine starts empty; a wrong guess costs decode a longer prefill, never a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from pd_runtime.prefix_cache import BLOCK_SIZE, PrefixCache, chained, id_blocks
from pd_runtime.proxy.affinity import CHARS_PER_TOKEN, chat_text, completion_prompt

DisaggregationPolicy = Literal["always", "threshold"]
Reason = Literal["disaggregated", "short_prompt", "cached_prefix"]
REASONS: tuple[Reason, ...] = get_args(Reason)
TEXT_BLOCK_CHARS = BLOCK_SIZE * CHARS_PER_TOKEN
ALL_OF_IT = 1 << 62  # chat_text's character limit that takes every message


@dataclass(frozen=True)
class Prompt:
    """What the decision needs of a request's prompt."""

    tokens: int
    """Its length in tokens: exact for token ids, estimated for text (module docstring)."""
    blocks: tuple[int, ...]
    """The chained hashes of its full blocks (16 ids, or 64 characters of text)."""


def text_tokens(text: str) -> int:
    """Estimated tokens of ``text``: 4 ASCII characters a token, every other character one."""
    if text.isascii():
        return -(-len(text) // CHARS_PER_TOKEN)
    ascii_chars = len(text.encode("ascii", "ignore"))
    return -(-ascii_chars // CHARS_PER_TOKEN) + len(text) - ascii_chars


def text_blocks(text: str) -> tuple[int, ...]:
    full = len(text) - len(text) % TEXT_BLOCK_CHARS
    return chained((text[i : i + TEXT_BLOCK_CHARS],) for i in range(0, full, TEXT_BLOCK_CHARS))


def prompt_of(body: dict[str, Any]) -> Prompt | None:
    """The client body's one prompt; None for a batch of prompts or none (then it is disaggregated)."""
    prompt = completion_prompt(body)
    if isinstance(prompt, list):
        return Prompt(len(prompt), id_blocks(prompt))
    text = prompt if prompt is not None else chat_text(body, ALL_OF_IT)
    return None if text is None else Prompt(text_tokens(text), text_blocks(text))


def decide(policy: DisaggregationPolicy, threshold: int, prompt: Prompt | None, cached_tokens: int = 0) -> Reason:
    """How to serve a client request: ``disaggregated``, or on decode alone because the prompt is
    short (``short_prompt``) or because all but fewer than ``threshold`` of its tokens are in the
    decode engine's prefix cache (``cached_prefix``)."""
    if policy == "always" or prompt is None:
        return "disaggregated"
    if prompt.tokens < threshold:
        return "short_prompt"
    if prompt.tokens - cached_tokens < threshold:
        return "cached_prefix"
    return "disaggregated"


class DecodeCaches:
    """The proxy's estimate of each decode engine's prefix cache (module docstring), by instance key."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = capacity_tokens // BLOCK_SIZE
        self._caches: dict[str, PrefixCache] = {}

    def cached_tokens(self, engine: str, prompt: Prompt) -> int:
        """Tokens of ``prompt`` the engine is thought to hold (its last token is always computed)."""
        cache = self._caches.get(engine)
        if cache is None:
            return 0
        return min(cache.lookup(prompt.blocks) * BLOCK_SIZE, prompt.tokens - 1)

    def sent(self, engine: str, prompt: Prompt) -> None:
        """The engine was given ``prompt``: its blocks are in its cache from now on."""
        if not self.capacity_blocks:
            return
        cache = self._caches.get(engine)
        if cache is None:
            cache = self._caches[engine] = PrefixCache(self.capacity_blocks)
        cache.store(prompt.blocks)
