"""Which connections to the registration socket may stay (peers.py), in virtual time."""

from __future__ import annotations

from pd_runtime.proxy.peers import GRACE_S, SPARE_PEERS, PeerTable, peer_bound

PREFILL, DECODE = "10.0.0.7:20005", "10.0.0.7:40005"


def _full(bound: int, *accepted: tuple[int, str]) -> PeerTable:
    """A table of connections 10, 11, ... up to its bound, all made at 0 s, and the frames accepted from them."""
    table = PeerTable(bound)
    assert [table.connected(fd, now=0.0) for fd in range(10, 10 + bound)] == [None] * bound
    for fd, key in accepted:
        table.accepted(fd, key)
    return table


def test_past_the_bound_a_newcomer_is_refused_while_every_other_connection_is_young() -> None:
    table = _full(3)
    assert table.connected(13, now=GRACE_S / 2) == 13
    assert list(table.peers) == [10, 11, 12]


def test_past_the_bound_a_newcomer_replaces_the_oldest_connection_that_never_proved_itself() -> None:
    table = _full(3, (10, PREFILL))  # an engine's heartbeat, accepted by the registry
    assert table.connected(13, now=GRACE_S) == 11
    assert list(table.peers) == [10, 12, 13]


def test_engines_that_proved_themselves_are_never_replaced() -> None:
    assert _full(2, (10, PREFILL), (11, DECODE)).connected(12, now=100.0) == 12


def test_a_copy_of_an_engines_frame_on_another_connection_proves_nothing() -> None:
    table = _full(2, (10, PREFILL), (11, PREFILL))
    assert table.connected(12, now=GRACE_S) == 11
    assert table.gone(10) and not table.gone(10)
    table.accepted(12, PREFILL)  # the engine's new connection, once the old one closed
    assert table.speakers == {PREFILL: 12}


def test_the_bound_leaves_room_beyond_one_connection_per_engine() -> None:
    assert peer_bound(2) == 2 + SPARE_PEERS
