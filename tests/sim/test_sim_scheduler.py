"""The continuous-batching scheduler, step by step."""

from __future__ import annotations

import pytest

from pd_runtime.sim.scheduler import Scheduler, Sequence


def test_chunked_prefill_respects_the_token_budget() -> None:
    sched = Scheduler(max_batched_tokens=1000, max_num_seqs=8)
    seq = Sequence("a", prompt_tokens=2500, output_tokens=2)
    sched.add(seq)
    chunks = []
    for _ in range(3):
        step = sched.plan()
        assert step is not None
        chunks.append(step.shape.prefill_tokens)
        events = sched.commit(step)
        assert step.shape.tokens <= 1000
    assert chunks == [1000, 1000, 500]
    assert [e.index for e in events] == [1]  # the first token comes with the last chunk


def test_without_chunking_a_long_prompt_waits_for_a_full_budget() -> None:
    sched = Scheduler(max_batched_tokens=1000, max_num_seqs=8, chunked_prefill=False)
    sched.add(Sequence("long", 1500, 1))
    assert sched.plan() is None


def test_running_decodes_come_first_then_new_prefills_fill_the_budget() -> None:
    sched = Scheduler(max_batched_tokens=100, max_num_seqs=8)
    first = Sequence("a", 10, 5)
    sched.add(first)
    step = sched.plan()
    assert step is not None
    sched.commit(step)
    sched.add(Sequence("b", 500, 5))
    step = sched.plan()
    assert step is not None
    assert [(s.seq_id, n) for s, n in step.entries] == [("a", 1), ("b", 99)]
    assert step.decode_seqs == 1 and step.shape.prefill_tokens == 99


def test_max_num_seqs_caps_the_running_batch() -> None:
    sched = Scheduler(max_batched_tokens=10_000, max_num_seqs=2)
    for name in "abc":
        sched.add(Sequence(name, 10, 3))
    step = sched.plan()
    assert step is not None
    assert [s.seq_id for s, _ in step.entries] == ["a", "b"]
    assert len(sched.waiting) == 1


def test_sequences_finish_after_their_output_tokens() -> None:
    sched = Scheduler(max_batched_tokens=100, max_num_seqs=4)
    seq = Sequence("a", 5, 3)
    sched.add(seq)
    indexes = []
    while (step := sched.plan()) is not None:
        indexes += [(e.index, e.finished) for e in sched.commit(step)]
    assert indexes == [(1, False), (2, False), (3, True)]
    assert not sched.running and not sched.has_work


def test_waiting_for_remote_kv_is_skipped_until_it_lands() -> None:
    sched = Scheduler(max_batched_tokens=100, max_num_seqs=4)
    remote = Sequence("remote", 2000, 3, ready=False)
    sched.add(remote)
    sched.add(Sequence("local", 10, 1))
    step = sched.plan()
    assert step is not None
    assert [s.seq_id for s, _ in step.entries] == ["local"]
    sched.commit(step)
    assert sched.plan() is None
    sched.remote_kv_landed(remote)
    step = sched.plan()
    assert step is not None
    # only the last prompt token is recomputed: the rest of the KV came from the prefill engine
    assert [(s.seq_id, n) for s, n in step.entries] == [("remote", 1)]
    assert step.shape.prefill_tokens == 0


def test_abort_removes_a_sequence_anywhere() -> None:
    sched = Scheduler(max_batched_tokens=100, max_num_seqs=4)
    a, b = Sequence("a", 10, 5), Sequence("b", 10, 5)
    sched.add(a)
    sched.add(b)
    step = sched.plan()
    assert step is not None
    sched.commit(step)
    sched.abort(a)
    sched.add(c := Sequence("c", 10, 5))
    sched.abort(c)
    assert sched.running == [b] and not sched.waiting


def test_a_sequence_aborted_during_its_final_step_commits_nothing() -> None:
    """The client leaves while the step that finishes its request runs (vLLM skips such a request in
    update_from_output): the commit survives and serves the others."""
    sched = Scheduler(max_batched_tokens=100, max_num_seqs=4)
    last, other = Sequence("last", 10, 1), Sequence("other", 10, 2)
    sched.add(last)
    sched.add(other)
    step = sched.plan()
    assert step is not None
    sched.abort(last)
    events = sched.commit(step)
    assert [(e.seq.seq_id, e.index) for e in events] == [("other", 1)]
    assert sched.running == [other] and last.generated == 0


def _run_until_blocked(sched: Scheduler, steps: int = 200) -> None:
    for _ in range(steps):
        sched.preempt()
        step = sched.plan()
        if step is None:
            return
        sched.commit(step)


def _remote(seq_id: str, prompt: int, output: int) -> Sequence:
    return Sequence(seq_id, prompt, output, ready=False, remote=True)


def test_remote_kv_blocks_are_allocated_only_while_fewer_than_max_num_seqs_run() -> None:
    """vLLM's decode engine sends its block list to prefill when it allocates the blocks, which it does
    only while the running set is below max_num_seqs: past it, prefill's write waits (defer_timeout)."""
    sched = Scheduler(max_batched_tokens=1000, max_num_seqs=1)
    busy, queued = Sequence("busy", 10, 5), _remote("queued", 10, 5)
    sched.add(busy)
    sched.commit(sched.plan())  # type: ignore[arg-type]
    sched.add(queued)
    assert list(sched.allocate_remote()) == []
    _run_until_blocked(sched)
    assert busy.finished and list(sched.allocate_remote()) == [queued]


@pytest.mark.parametrize("stalls", [True, False])
def test_a_preempted_remote_sequence_stalls_only_before_the_fix(stalls: bool) -> None:
    """KV capacity for two 16-token prompts plus a little growth: the later sequence is preempted once
    both grow. vLLM < 0.32 (write mode) then waits for its remote KV again, forever; 0.32 recomputes."""
    sched = Scheduler(max_batched_tokens=1000, max_num_seqs=8, kv_blocks=4, preempted_remote_stalls=stalls)
    first, second = _remote("first", 16, 20), _remote("second", 16, 20)
    for seq in (first, second):
        sched.add(seq)
    assert list(sched.allocate_remote()) == [first, second]
    for seq in (first, second):
        sched.remote_kv_landed(seq)
    _run_until_blocked(sched)
    assert first.finished and second.preemptions >= 1
    assert second.finished is not stalls
    assert (not second.ready) is stalls
