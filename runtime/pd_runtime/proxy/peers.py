"""Pure: which connections to the registration socket may stay (no I/O; time is passed in).

libzmq accepts every connection its ROUTER's listener gets, and the ROUTER hands out one message per
connection in turn, so the number of connections is how many strangers' frames an engine's heartbeat
can wait behind (docs/proxy.md#who-may-register). The table bounds it: past ``bound`` connections a
newcomer takes the place of the oldest connection that has not proven itself (sent a frame the registry
accepted, for an instance no other connection speaks for) within ``GRACE_S``; if there is none, the
newcomer is refused. The listener shuts down whatever the table lets go, and the connections whose
frames the registry refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Connections beyond one per engine: an engine's new connection while its old one closes, strangers
# waiting for their frames to be read and refused.
SPARE_PEERS = 16
# An engine's first heartbeat follows its connection at once (vLLM's _ping sends, then sleeps); the
# listener reads every connection within a round of at most ``bound`` frames.
GRACE_S = 1.0


def peer_bound(instances: int) -> int:
    """Connections for at most ``instances`` engines (the rendered ones, or --max-instances)."""
    return instances + SPARE_PEERS


@dataclass
class Peer:
    since: float
    proven: bool = False


@dataclass
class PeerTable:
    """Open connections by file descriptor, oldest first."""

    bound: int
    peers: dict[int, Peer] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)  # instance key -> the connection that proved it

    def connected(self, fd: int, now: float) -> int | None:
        """A new connection; returns the one to shut down to stay within the bound (it or an older one)."""
        victim = None
        if len(self.peers) >= self.bound:
            unproven = next((old for old, peer in self.peers.items() if not peer.proven), None)
            victim = unproven if unproven is not None and now - self.peers[unproven].since >= GRACE_S else fd
            self.gone(victim)
        if victim != fd:
            self.peers[fd] = Peer(now)
        return victim

    def gone(self, fd: int) -> bool:
        """The connection closed or is being dropped; False if the table did not hold it."""
        peer = self.peers.pop(fd, None)
        if peer is not None and peer.proven:
            for key in [key for key, speaker in self.speakers.items() if speaker == fd]:
                del self.speakers[key]
        return peer is not None

    def holds(self, fd: int) -> bool:
        return fd in self.peers

    def accepted(self, fd: int, key: str) -> None:
        """The registry accepted a frame for ``key`` from this connection: it proves itself, unless another
        open connection already speaks for that instance (a copy of an engine's frame proves nothing)."""
        peer = self.peers.get(fd)
        if peer is not None and key not in self.speakers:
            self.speakers[key] = fd
            peer.proven = True
