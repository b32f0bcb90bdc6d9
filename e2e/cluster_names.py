"""The node agent's stand-in for cluster DNS: Services and their EndpointSlices, mirrored cluster-wide.

Every agent watches all Services and all EndpointSlices (written by the real kube-controller-manager
for pods on every node), so a Service name resolves in a pod's hosts file to a ready pod wherever it
runs. `changed` is set on every change; the agent then rewrites the hosts files of its pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from e2e import podspec
from e2e.kubeapi import KubeClient
from e2e.podspec import Endpoint, Obj, PodAddress

Key = tuple[str, str]
T = TypeVar("T")


def _key(obj: Obj) -> Key:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


class ClusterNames:
    def __init__(self, api: KubeClient) -> None:
        self.api = api
        self.services: dict[Key, Obj] = {}
        self.slices: dict[Key, list[Endpoint]] = {}
        self.changed = asyncio.Event()

    async def watch_services(self) -> None:
        await self._mirror("/api/v1/services", self.services, lambda svc: svc)

    async def watch_endpoint_slices(self) -> None:
        await self._mirror("/apis/discovery.k8s.io/v1/endpointslices", self.slices, podspec.slice_endpoints)

    async def _mirror(self, path: str, store: dict[Key, T], convert: Callable[[Obj], T]) -> None:
        async for kind, obj in self.api.watch(path):
            if kind == "SYNCED":
                store.clear()
                store.update({_key(item): convert(item) for item in obj.get("items", [])})
            elif kind == "DELETED":
                store.pop(_key(obj), None)
            else:
                store[_key(obj)] = convert(obj)
            self.changed.set()

    def targets(self, local_pods: list[PodAddress]) -> dict[Key, str]:
        endpoints = [e for found in self.slices.values() for e in found]
        return podspec.service_targets(list(self.services.values()), local_pods, endpoints)
