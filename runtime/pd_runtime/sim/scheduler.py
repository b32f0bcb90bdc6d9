"""Pure continuous-batching scheduler, the shape of vLLM V1's: one token budget per step, running
sequences first (decodes and unfinished prefill chunks), then waiting ones in arrival order while
both the budget and ``max_num_seqs`` allow, with long prompts split into chunks (chunked prefill).

The scheduler only decides; the caller times the step (``timing.step_time``) and then commits it. The
live engine and the discrete-event simulation drive the same class, so calibration results carry over.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from pd_runtime.prefix_cache import BLOCK_SIZE
from pd_runtime.sim.timing import BatchShape


@dataclass(eq=False)
class Sequence:
    """One request inside an engine."""

    seq_id: str
    prompt_tokens: int
    output_tokens: int
    """Tokens to generate before the sequence finishes (max_tokens, or where EOS falls)."""
    ready: bool = True
    """False while the KV cache is still coming from a prefill engine (WAITING_FOR_REMOTE_KVS)."""
    remote: bool = False
    """Its prompt's KV comes from a prefill engine (a write-mode decode request)."""
    allocated: bool = False
    """Holds KV blocks: running, or waiting for remote KV after its blocks were allocated."""
    preemptions: int = 0
    computed: int = 0
    """Tokens whose KV is in the cache."""
    generated: int = 0
    released: bool = False
    """Aborted (or finished and forgotten): a step planned before that commits nothing for it."""

    @property
    def length(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.generated == 0

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens

    @property
    def blocks(self) -> int:
        """Blocks for its KV including the token the next step writes."""
        return math.ceil((self.length + 1) / BLOCK_SIZE)


@dataclass(frozen=True)
class TokenEvent:
    """A token sampled for ``seq`` in a committed step (``index`` counts from 1)."""

    seq: Sequence
    index: int
    finished: bool


@dataclass(frozen=True)
class Step:
    entries: tuple[tuple[Sequence, int], ...]
    shape: BatchShape
    decode_seqs: int


@dataclass
class Scheduler:
    max_batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool = True
    kv_blocks: int | None = None
    """KV-cache capacity in blocks; None: unbounded (no preemption)."""
    preempted_remote_stalls: bool = False
    """vLLM < 0.32, write mode: a preempted remote-KV request waits for that KV again (never comes)."""
    aborted_remote_keeps_blocks: bool = False
    """vLLM 0.31, write mode: a remote-KV request aborted while waiting for its KV keeps its blocks."""
    leaked_blocks: int = 0
    """Blocks kept by such aborted requests: never free again."""
    transfer_blocks: int = 0
    """Blocks finished producer requests keep until their decode engine has the KV (delay-freed)."""
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence) -> None:
        if seq.output_tokens < 1:
            raise ValueError("a sequence must generate at least one token")
        self.waiting.append(seq)

    def remote_kv_landed(self, seq: Sequence) -> None:
        """The prompt's KV arrived from the prefill engine: only its last token is recomputed (vLLM
        resamples the first output token itself), then the sequence decodes."""
        seq.computed = max(seq.computed, seq.prompt_tokens - 1)
        seq.ready = True

    def remote_kv_failed(self, seq: Sequence) -> None:
        """The prompt's KV will never land (``kv_load_failure_policy: recompute``): vLLM sets the request's
        computed tokens to 0 and schedules it as a local prefill, so it is no remote-KV sequence any more."""
        seq.computed = 0
        seq.remote = False
        seq.ready = True

    def abort(self, seq: Sequence) -> None:
        """Forget a sequence wherever it is, also while a planned step that holds it runs."""
        seq.released = True
        if self.aborted_remote_keeps_blocks and seq.remote and not seq.ready and seq.allocated:
            self.leaked_blocks += seq.blocks
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.allocated = False

    def _free_blocks(self) -> float:
        if self.kv_blocks is None:
            return math.inf
        held = sum(s.blocks for s in self.running) + sum(s.blocks for s in self.waiting if s.allocated)
        held += self.leaked_blocks + self.transfer_blocks
        return self.kv_blocks - held

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache's blocks held (vllm:kv_cache_usage_perc); 0 for an unbounded cache."""
        if not self.kv_blocks:
            return 0.0
        return min(1.0, (self.kv_blocks - self._free_blocks()) / self.kv_blocks)

    def allocate_remote(self) -> Iterator[Sequence]:
        """Remote-KV sequences that get their blocks now, which is when a decode engine sends its block
        list to prefill: vLLM considers waiting requests only while fewer than ``max_num_seqs`` run, so
        past that the list (and prefill's write) waits; prefill drops it after ``defer_timeout``."""
        for seq in self.waiting:
            if len(self.running) >= self.max_num_seqs:
                return
            if not seq.ready and not seq.allocated and seq.blocks <= self._free_blocks():
                seq.allocated = True
                yield seq

    def preempt(self) -> list[Sequence]:
        """vLLM's recompute preemption: while the running set's next tokens do not fit, the most recently
        admitted sequence frees its blocks and goes back to the head of the queue."""
        preempted: list[Sequence] = []
        while self._free_blocks() < 0 and len(self.running) > 1:
            victim = self.running.pop()
            victim.computed = 0
            victim.allocated = False
            victim.preemptions += 1
            if victim.remote and self.preempted_remote_stalls:
                victim.ready = False  # waits for remote KV that prefill already sent and freed
            self.waiting.appendleft(victim)
            preempted.append(victim)
        return preempted

    @property
    def has_work(self) -> bool:
        return bool(self.running) or any(seq.ready for seq in self.waiting)

    def plan(self) -> Step | None:
        """The next step's batch, or None when nothing can run."""
        budget = self.max_batched_tokens
        entries: list[tuple[Sequence, int]] = []
        for seq in self.running:
            if budget <= 0:
                break
            take = min(seq.length - seq.computed, budget)
            entries.append((seq, take))
            budget -= take
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if not seq.ready:
                continue
            need = seq.length - seq.computed
            if need > budget and not self.chunked_prefill:
                break
            if not seq.allocated and seq.blocks > self._free_blocks():
                break  # no room for its blocks: it waits (new requests never preempt running ones)
            take = min(need, budget)
            seq.allocated = True
            self.waiting.remove(seq)
            self.running.append(seq)
            entries.append((seq, take))
            budget -= take
        if not entries:
            return None
        return _make_step(entries)

    def commit(self, step: Step) -> list[TokenEvent]:
        """Apply a planned step: advance KV, sample a token for every sequence that caught up.

        A sequence aborted while the step ran is skipped, as vLLM's ``Scheduler.update_from_output``
        skips a request that is gone or finished: it is no longer in ``running``, even if this was its
        final step."""
        events: list[TokenEvent] = []
        for seq, count in step.entries:
            if seq.released:
                continue
            seq.computed += count
            if seq.computed < seq.length:
                continue  # a prefill chunk that has not reached the end of the prompt yet
            seq.generated += 1
            events.append(TokenEvent(seq=seq, index=seq.generated, finished=seq.finished))
            if seq.finished:
                self.running.remove(seq)
        return events


def _make_step(entries: list[tuple[Sequence, int]]) -> Step:
    tokens = decode_context = prefill_pairs = prefill_tokens = decode_seqs = 0
    for seq, count in entries:
        tokens += count
        if count == 1 and seq.computed > 0:
            decode_context += seq.computed + 1
            decode_seqs += 1
        else:
            prefill_tokens += count
            prefill_pairs += count * (seq.computed + count // 2)
    shape = BatchShape(
        tokens=tokens, prefill_tokens=prefill_tokens, decode_context=decode_context, prefill_pairs=prefill_pairs
    )
    return Step(entries=tuple(entries), shape=shape, decode_seqs=decode_seqs)
