"""Pod networking for the node agent: one network namespace per pod, veth pairs to a bridge.

The node's own host network is a namespace too (`pd-<id>-node`, on the bridge like a pod): the node's
InternalIP, the kubelet endpoint and every hostNetwork pod live there, never in the machine's own
network namespace, so the fixed ports of hostNetwork pods cannot collide with anything on the machine,
and two hostNetwork pods on this node collide with each other exactly as on a real node.

Several nodes form one cluster network: every agent of a cluster plugs its namespaces into the same
bridge (the stack creates it, `pdcl<id>`), each node with its own /24 pod CIDR (`node.spec.podCIDR`,
allocated by the real kube-controller-manager from the cluster CIDR). Every namespace gets an on-link
route to the whole cluster CIDR, so a pod reaches a pod on another node by its IP, directly over the
bridge, as on a flat pod network; the machine's address in each node's /24 (on the bridge) is how
tests and the API server reach pods and kubelets. A standalone agent makes a private bridge instead.

Pods get no default route: anything beyond the cluster network is unreachable at once (no traffic
leaves the machine, and nothing hangs waiting for it). Every name carries the agent's run id
(`pdbr<id>`, `pd-<id>-<n>`, `pdv<id>n<n>`), so two agents on one machine never clash and a crashed run
can be swept by id. Addresses come from 10.213.0.0/16, from blocks that no interface uses yet;
traffic stays inside namespaces and the bridge this module creates.
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import json
import logging
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

_POOL = ipaddress.IPv4Network("10.213.0.0/16")
_CLONE_NEWNET = 0x40000000
NODE_NETNS_INDEX = 0  # pods count from 1
T = TypeVar("T")


class NetError(RuntimeError):
    pass


async def _ip(*args: str, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {err.decode().strip()}")
    return out.decode()


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
    """The cluster's bridge, shared by the agents of all its nodes (made before the first agent starts)."""
    subprocess.run(["ip", *bridge_link(name)], check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)


def delete_bridge(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True)


class PodNetwork:
    """The per-pod namespaces of one node agent, on the cluster's bridge or on a private one.

    `bridge` and `cluster_cidr` join a cluster network (the node's `subnet` is its pod CIDR); without
    them the agent makes its own bridge and picks a free /24."""

    def __init__(
        self,
        run_id: str | None = None,
        bridge: str | None = None,
        cluster_cidr: ipaddress.IPv4Network | None = None,
    ) -> None:
        self.run_id = run_id or secrets.token_hex(2)
        self.owns_bridge = bridge is None
        self.bridge = bridge or f"pdbr{self.run_id}"
        self.cluster_cidr = cluster_cidr
        self.subnet: ipaddress.IPv4Network | None = None
        self._free: list[ipaddress.IPv4Address] = []
        self._pods: dict[str, tuple[str, str]] = {}  # key -> (netns, ip)
        self._counter = 0

    @property
    def gateway(self) -> str:
        """The bridge's address in the machine's namespace: how the machine (tests, API server) reaches pods."""
        assert self.subnet is not None
        return str(next(self.subnet.hosts()))

    @property
    def node_netns(self) -> str:
        return f"pd-{self.run_id}-node"

    @property
    def node_ip(self) -> str:
        """The node's InternalIP, in its host network namespace."""
        assert self.subnet is not None
        return str(list(self.subnet.hosts())[1])

    async def setup(self, pod_cidr: ipaddress.IPv4Network | None = None) -> None:
        """Plug the node in: `pod_cidr` is the node's spec.podCIDR (a free /24 is chosen without one)."""
        self.subnet = pod_cidr or choose_subnet()
        hosts = list(self.subnet.hosts())
        self._free = hosts[2:]
        if self.owns_bridge:
            await _ip(*bridge_link(self.bridge))
        await _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        await _ip("link", "set", self.bridge, "up")
        await self._add_namespace(self.node_netns, NODE_NETNS_INDEX, hosts[1])
        log.info("pod network %s on bridge %s, node %s in %s", self.subnet, self.bridge, self.node_ip, self.node_netns)

    async def add_pod(self, key: str) -> tuple[str, str]:
        """Create the pod's namespace with eth0 on the bridge; returns (netns name, pod IP)."""
        if key in self._pods:
            return self._pods[key]
        if not self._free or self.subnet is None:
            raise NetError("pod network exhausted or not set up")
        self._counter += 1
        netns = f"pd-{self.run_id}-{self._counter}"
        address = self._free.pop(0)
        self._pods[key] = (netns, str(address))
        await self._add_namespace(netns, self._counter, address)
        return netns, str(address)

    async def _add_namespace(self, netns: str, index: int, address: ipaddress.IPv4Address) -> None:
        assert self.subnet is not None
        host_if, peer_if = self._veth_names(index)
        await _ip("netns", "add", netns)
        await _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        await _ip("link", "set", peer_if, "netns", netns)
        await _ip("link", "set", host_if, "master", self.bridge, "up")
        await _ip("-n", netns, "link", "set", peer_if, "name", "eth0")
        await _ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        await _ip("-n", netns, "link", "set", "eth0", "up")
        await _ip("-n", netns, "link", "set", "lo", "up")
        if self.cluster_cidr is not None:  # the other nodes' pods, on the same bridge
            await _ip("-n", netns, "route", "add", str(self.cluster_cidr), "dev", "eth0")

    def _veth_names(self, index: int) -> tuple[str, str]:
        return f"pdv{self.run_id}n{index}", f"pdp{self.run_id}n{index}"

    async def remove_pod(self, key: str) -> None:
        entry = self._pods.pop(key, None)
        if entry is None:
            return
        netns, address = entry
        await _ip("netns", "del", netns, check=False)  # the veth pair goes with its namespace end
        self._free.append(ipaddress.ip_address(address))  # type: ignore[arg-type]

    async def teardown(self) -> None:
        for key in list(self._pods):
            await self.remove_pod(key)
        await _ip("netns", "del", self.node_netns, check=False)
        if self.owns_bridge:
            await _ip("link", "del", self.bridge, check=False)
        elif self.subnet is not None:
            await _ip("addr", "del", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge, check=False)

    def listening_socket(self, port: int = 0) -> socket.socket:
        """A TCP socket bound to the node's IP inside its host network namespace (the kubelet endpoint)."""
        return socket_in_netns(self.node_netns, (self.node_ip, port))


def _enter(netns: str) -> None:
    """Move the calling thread into `netns` (setns changes only that thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


async def run_in_netns(netns: str, work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own inside `netns` (a socket it opens belongs there), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def enter_and_run() -> None:
        try:
            _enter(netns)
            result = work()
        except BaseException as err:  # handed to the caller
            loop.call_soon_threadsafe(_settle, done, None, err)
        else:
            loop.call_soon_threadsafe(_settle, done, result, None)

    threading.Thread(target=enter_and_run, name=f"netns {netns}", daemon=True).start()
    return await done


def _settle(future: asyncio.Future[T], result: T | None, err: BaseException | None) -> None:
    if future.done():
        return  # the caller gave up (cancelled)
    if err is not None:
        future.set_exception(err)
    else:
        future.set_result(result)  # type: ignore[arg-type]


def socket_in_netns(netns: str, address: tuple[str, int]) -> socket.socket:
    """A bound TCP socket that belongs to `netns`: made by a thread that enters the namespace (setns changes
    only the calling thread), so the agent's own threads stay in the machine's namespace."""
    made: list[socket.socket | BaseException] = []

    def enter_and_bind() -> None:
        try:
            _enter(netns)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            made.append(sock)
        except BaseException as err:  # handed to the caller
            made.append(err)

    thread = threading.Thread(target=enter_and_bind, name=f"netns {netns}")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def sweep(run_id: str) -> None:
    """Remove whatever a (crashed) agent with this run id left behind: namespaces, veths, bridge."""
    prefix = f"pd-{run_id}-"
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout or "[]")
    for link in links:
        name = link.get("ifname", "")
        if name == f"pdbr{run_id}" or name.startswith((f"pdv{run_id}n", f"pdp{run_id}n")):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
