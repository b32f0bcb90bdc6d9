"""Pure: who may read the admin port's ``/status`` without the admin key.

The admin port serves ``/status`` (the registered engines with their side-channel addresses, load, the
last transfer, the canary) to the operator, the router and the engines' preStop hook
(``pdctl wait-proxy-gone``). With an admin key set, a request needs ``Authorization: Bearer <key>``
unless it comes from loopback in the pod's own network namespace, which only the pod's own containers
share. With ``--network host`` (the pod on the node's network) loopback is the node's, shared with every
process and host-network pod of the node, so every request needs the key. Without a key (a standalone
``pdctl proxy``) the port is open, as before. ``/metrics`` stays open: docs/security.md says why.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Literal

Network = Literal["pod", "host"]


def is_loopback(peer: str | None) -> bool:
    """Whether the peer address is loopback (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6)."""
    try:
        address = ipaddress.ip_address(peer or "")
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def bearer_matches(authorization: str, key: str) -> bool:
    """``Bearer <key>``, compared as digests so the time taken says nothing about the key."""
    scheme, _, token = authorization.partition(" ")
    supplied = hashlib.sha256(token.encode()).digest()
    return scheme.lower() == "bearer" and hmac.compare_digest(supplied, hashlib.sha256(key.encode()).digest())


def admitted(peer: str | None, authorization: str, key: str | None, network: Network) -> bool:
    """Whether an admin request may read ``/status``."""
    if not key:
        return True
    if network == "pod" and is_loopback(peer):
        return True
    return bearer_matches(authorization, key)
