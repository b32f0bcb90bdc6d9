"""A cluster's network on the machine: the bridge its nodes plug into and address blocks no interface uses.

Each real node is a network namespace of its own on the cluster's bridge (`pdcl<id>`, made by the stack;
e2e/real_node.py plugs the nodes in). Addresses come from 10.213.0.0/16, from blocks that no interface of
the machine uses yet; traffic stays inside the namespaces and the bridge the harness creates.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess

_POOL = ipaddress.IPv4Network("10.213.0.0/16")


class NetError(RuntimeError):
    pass


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    nets = []
    for link in json.loads(out or "[]"):
        for addr in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return nets


def choose_subnet(prefix: int = 24) -> ipaddress.IPv4Network:
    """A block of the pool (a node's /24, a cluster's CIDR) that overlaps no address on this machine."""
    used = _used_networks()
    candidates: list[ipaddress.IPv4Network] = list(_POOL.subnets(new_prefix=prefix))
    start = secrets.randbelow(len(candidates))
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise NetError(f"no free /{prefix} left in {_POOL}")


def bridge_link(name: str) -> list[str]:
    """`ip` arguments that make a bridge with a MAC address of its own (locally administered, random).

    One the kernel picks follows the lowest MAC among the bridge's ports, so a pod's veth leaving could
    change it, and every other pod's neighbour entry for the gateway would then name a MAC nobody has:
    their traffic to the host stalls until the entry is resolved again (a second or more; seen in the
    autoscaling ramp as a stream stalling on a replica that stayed when another was removed).
    """
    mac = ":".join(["02", *(secrets.token_hex(1) for _ in range(5))])
    return ["link", "add", name, "address", mac, "type", "bridge"]


def create_bridge(name: str) -> None:
    """The cluster's bridge, shared by all its nodes (made before the first node starts)."""
    subprocess.run(["ip", *bridge_link(name)], check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)


def delete_bridge(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True)
