"""Pure: the router's view of a PDDeployment's replicas and the policy that picks one per request.

The router (``pdctl proxy --router``) sits in front of the serving pods' proxies. It learns the ready
ones from the Service's EndpointSlices and their load from two sources: what it has in flight on each
itself (exact, immediate) and what each proxy reports in flight on its admin ``/status`` (every
client's, including the other router replica's and direct Service traffic, a scrape interval old).
A replica's load is the larger of the two, so neither a stale report nor a second router hides work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Replica:
    """One serving pod's proxy as the router sees it."""

    address: str  # host:port of the proxy's OpenAI API
    in_flight: int = 0  # this router's requests to it that have not finished
    reported: int = 0  # requests in flight as the proxy's admin /status last said
    routed: int = 0  # requests this router ever sent it

    @property
    def load(self) -> int:
        return max(self.in_flight, self.reported)


def pick(replicas: Sequence[Replica], avoid: frozenset[str] = frozenset()) -> Replica | None:
    """The least loaded replica (ties: the one routed least, then by address), skipping ``avoid``."""
    candidates = [r for r in replicas if r.address not in avoid]
    return min(candidates, key=lambda r: (r.load, r.routed, r.address), default=None)


def ready_addresses(slices: Iterable[Mapping[str, Any]], port: int) -> list[str]:
    """EndpointSlice documents -> ``ip:port`` of every ready endpoint, sorted, without duplicates.

    An endpoint is ready when ``conditions.ready`` is true; absent counts as ready (the
    EndpointSlice API's documented default), a terminating pod's endpoint says false.
    """
    found = {
        f"{address}:{port}"
        for eps in slices
        for ep in eps.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready", True) is not False
        for address in ep.get("addresses") or []
    }
    return sorted(found)


def reported_in_flight(status: Mapping[str, Any]) -> int:
    """Requests in flight at a proxy, from its admin /status document (0 when it says nothing usable)."""
    value = status.get("in_flight")
    return value if isinstance(value, int) and value >= 0 else 0
