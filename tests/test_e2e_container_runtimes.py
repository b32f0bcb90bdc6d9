"""The e2e session's check that every container ran under a real node's containerd reads each pod event's
container ids as the kubelet writes them (scheme://id), init containers included, and ignores containers
that have not started (no id yet). No cluster: the watch's events are fed to it directly."""

from __future__ import annotations

from typing import Any, cast

from e2e.cluster import ControlPlane
from e2e.tests.kube import ContainerRuntimes


def _pod(name: str, **statuses: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": name, "resourceVersion": "7"}, "status": statuses}


def test_containers_of_another_runtime_are_named_and_waiting_ones_ignored() -> None:
    runtimes = ContainerRuntimes(cast(ControlPlane, None), "")
    runtimes.listed([_pod("a", containerStatuses=[{"name": "proxy", "containerID": "containerd://1"}])])
    event = {
        "type": "MODIFIED",
        "object": _pod(
            "b",
            initContainerStatuses=[{"name": "init", "containerID": "docker://2"}],
            containerStatuses=[{"name": "engine"}, {"name": "proxy", "containerID": ""}],
        ),
    }
    assert runtimes.apply_event(event) == "7"
    assert runtimes.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    assert runtimes.apply_event({"type": "ERROR", "object": {"code": 410}}) == ""
    assert runtimes.containers["containerd"] == {"t/a/proxy"}
    assert runtimes.others("containerd") == {"docker": {"t/b/init"}}
