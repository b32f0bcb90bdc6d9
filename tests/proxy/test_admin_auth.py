"""The admin port's /status: open on the pod's own loopback, the admin key from anywhere else, and from
loopback too when the pod shares the node's network (--network host); /metrics stays open."""

from __future__ import annotations

import pytest

from pd_runtime.proxy.admin_auth import admitted, is_loopback
from tests.proxy.conftest import SetupFactory

KEY = "admin-secret"


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_loopback_in_the_pods_own_network_needs_no_key(peer: str) -> None:
    assert is_loopback(peer) and admitted(peer, "", KEY, "pod")


@pytest.mark.parametrize("peer", ["10.1.2.3", "192.168.0.7", "fe80::1", "::ffff:10.0.0.1", "", None, "junk"])
def test_any_other_peer_needs_the_key(peer: str | None) -> None:
    assert not admitted(peer, "", KEY, "pod")
    assert not admitted(peer, "Bearer wrong", KEY, "pod")
    assert not admitted(peer, KEY, KEY, "pod"), "the scheme is Bearer"
    assert admitted(peer, f"Bearer {KEY}", KEY, "pod") and admitted(peer, f"bearer {KEY}", KEY, "pod")


def test_on_the_nodes_network_loopback_needs_the_key_too() -> None:
    assert not admitted("127.0.0.1", "", KEY, "host")
    assert admitted("127.0.0.1", f"Bearer {KEY}", KEY, "host")


def test_without_a_key_the_admin_port_is_open_as_a_standalone_proxy_always_was() -> None:
    assert admitted("10.1.2.3", "", None, "host")


async def test_a_host_network_proxy_asks_every_status_reader_for_the_key(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False, admin_key=KEY, network="host")
    async with setup.client.get(setup.admin_url + "/status") as resp:
        body = await resp.json()
        assert resp.status == 401 and body["error"]["code"] == "invalid_admin_key"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with setup.client.get(setup.admin_url + "/status", headers=headers) as resp:
        assert resp.status == 200 and "instances" in await resp.json()
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        assert resp.status == 200, "Prometheus scrapes without a per-deployment key (docs/security.md)"


async def test_in_the_pods_own_network_loopback_reads_status_without_the_key(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False, admin_key=KEY)
    async with setup.client.get(setup.admin_url + "/status") as resp:
        assert resp.status == 200
