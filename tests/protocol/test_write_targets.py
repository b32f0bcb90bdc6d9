"""protocol.write_targets: which decode ranks a prefill rank writes in vLLM 0.33's write mode (the
conformance tier compares it with vLLM's own moriio_tp_mapping for every TP pair)."""

from __future__ import annotations

import pytest

from pd_runtime import protocol


def test_equal_tp_writes_rank_to_rank() -> None:
    assert [protocol.write_targets(r, 4, 4, 4) for r in range(4)] == [[(0, 1)], [(1, 1)], [(2, 1)], [(3, 1)]]


def test_fan_out_feeds_consecutive_decode_ranks() -> None:
    assert protocol.write_targets(1, 2, 4, 4) == [(2, 1), (3, 1)]


def test_fan_in_each_decode_rank_counts_its_writers() -> None:
    assert [protocol.write_targets(r, 4, 2, 4) for r in range(4)] == [[(0, 2)], [(0, 2)], [(1, 2)], [(1, 2)]]


def test_fan_in_of_replicated_heads_is_written_once() -> None:
    # 2 KV heads over 8 prefill ranks: ranks 0-3 hold head 0, 4-7 head 1; decode TP2 rank 0 needs head 0
    assert [protocol.write_targets(r, 8, 2, 2) for r in range(4)] == [[(0, 1)], [], [], []]


def test_tp_sizes_that_are_not_multiples_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple"):
        protocol.write_targets(0, 2, 3, 4)


def test_write_failed_and_writers_frames_parse() -> None:
    assert protocol.parse_notify(protocol.write_failed_message("tx")) == {"type": "write_failed", "transfer_id": "tx"}
    assert protocol.parse_notify(protocol.write_done_message("tx", 2))["num_writers"] == 2
    assert "num_writers" not in protocol.parse_notify(protocol.write_done_message("tx"))
