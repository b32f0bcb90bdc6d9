"""The done-when of issue 19's registration item, on the rendered pod's containers: a process in the
serving pod's network namespace that is not one of its engines sends registration frames to the proxy
(a decode engine of its own, and the real prefill's address with another side-channel host). The proxy
the operator rendered knows its engines (``--expected-engine``, one per engine, the pod IP expanded by
the kubelet): it refuses both, counts them, and serves every client request on the real engines; the
rogue receives nothing (rogue.py; the seed's hostNetwork example runs the same check from the node).
And the pod's keys (issue 28): its engines answer /v1 only with the engine key the proxy sends, and the
proxy's admin /status answers a reader off the pod only with the admin key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from e2e.cluster import ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import credential, proxy_status, serving_pod, simulated_deployment
from e2e.tests.rogue import check_rogue_gets_nothing

NAME = "rogue-frames"


@pytest.fixture(scope="module")
def deployed(operator: Stack) -> Iterator[str]:
    with simulated_deployment(operator.cp, "pd-registration", NAME) as namespace:
        yield namespace


def test_frames_from_a_process_that_is_not_an_engine_never_receive_a_request(
    stack: Stack, cp: ControlPlane, deployed: str, tmp_path: Path
) -> None:
    check_rogue_gets_nothing(stack, serving_pod(cp, deployed, NAME), tmp_path)


def test_the_engines_and_the_admin_port_ask_anyone_but_the_proxy_for_the_pods_keys(
    cp: ControlPlane, deployed: str
) -> None:
    serving = serving_pod(cp, deployed, NAME)
    ip = serving["status"]["podIP"]
    ports = [p["containerPort"] for c in serving["spec"]["containers"] for p in c["ports"] if p["name"] == "p-http"]
    models = f"http://{ip}:{ports[0]}/v1/models"
    assert httpx.get(models, timeout=10, trust_env=False).status_code == 401
    engine_key = {"Authorization": f"Bearer {credential(cp, serving, 'engine-key')}"}
    assert httpx.get(models, headers=engine_key, timeout=10, trust_env=False).status_code == 200
    assert httpx.get(f"http://{ip}:8001/status", timeout=10, trust_env=False).status_code == 401
    assert proxy_status(cp, serving)["counts"]["engines"] == 2
    assert httpx.get(f"http://{ip}:8001/metrics", timeout=10, trust_env=False).status_code == 200
