"""Pure: vLLM's automatic prefix caching as the simulated engine models it (``--sim-prefix-cache-blocks``)
and as the proxy estimates each decode engine's (``proxy.disaggregation``).

vLLM hashes a prompt's full blocks of 16 tokens, each hash chained to the one before it, and keeps the KV
of freed blocks until their room is needed (least recently used first); a new prompt reuses its longest
run of leading blocks found there and computes only the rest, its last token always
(``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``). The simulator has no tokenizer: a prompt
of token ids is cut into blocks of 16 ids; a text prompt, or the text of chat messages, into the pieces
``openai.count_text_tokens`` counts, 16 tokens' worth to a block (the proxy: 4 characters a token). Hashes
are Python's own (one process, one cache: they never leave it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

BLOCK_SIZE = 16  # tokens per KV-cache block, vLLM's default


def chained(blocks: Iterable[tuple[object, ...]]) -> tuple[int, ...]:
    """Each block's hash, chained to its predecessor's (a block is cached only with what precedes it)."""
    hashes, previous = [], 0
    for block in blocks:
        previous = hash((previous, block))
        hashes.append(previous)
    return tuple(hashes)


def id_blocks(ids: Sequence[int]) -> tuple[int, ...]:
    """The full blocks of a token-id prompt."""
    full = len(ids) - len(ids) % BLOCK_SIZE
    return chained(tuple(ids[i : i + BLOCK_SIZE]) for i in range(0, full, BLOCK_SIZE))


def piece_blocks(pieces: Iterable[tuple[str, int]]) -> tuple[int, ...]:
    """The full blocks of a text cut into (piece, tokens) pairs: a block closes at the piece that fills it."""

    def blocks() -> Iterable[tuple[str, ...]]:
        current: list[str] = []
        tokens = 0
        for piece, count in pieces:
            current.append(piece)
            tokens += count
            if tokens >= BLOCK_SIZE:
                yield tuple(current)
                current, tokens = [], 0

    return chained(blocks())


class PrefixCache:
    """Block hashes whose KV an engine core keeps, at most ``capacity`` blocks, least recently used out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Sequence[int]) -> int:
        """How many of the prompt's leading blocks are cached (those are used again: most recent now)."""
        found = 0
        for block in hashes:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            found += 1
        return found

    def store(self, hashes: Sequence[int]) -> None:
        """The prompt's blocks were computed: keep them, dropping the least recently used past capacity."""
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
