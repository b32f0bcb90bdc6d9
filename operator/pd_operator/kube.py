"""The few Kubernetes API calls the handlers make, as plain JSON over the official client's transport.

One generic path per verb (get, list, create, merge-patch, delete) keyed by kind, so every child object
goes through the same code; the client library supplies authentication (in-cluster service account or
kubeconfig). Calls run in a worker thread so they never block kopf's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client, config

log = logging.getLogger(__name__)
Obj = dict[str, Any]
Outcome = Literal["created", "patched", "unchanged"]


@dataclass(frozen=True)
class Kind:
    api_version: str
    plural: str


KINDS: dict[str, Kind] = {
    "Pod": Kind("v1", "pods"),
    "Service": Kind("v1", "services"),
    "ConfigMap": Kind("v1", "configmaps"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "Job": Kind("batch/v1", "jobs"),
    "ResourceClaimTemplate": Kind("resource.k8s.io/v1", "resourceclaimtemplates"),
}


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def collection_path(kind: str, namespace: str) -> str:
    k = KINDS[kind]
    root = "/api/v1" if k.api_version == "v1" else f"/apis/{k.api_version}"
    return f"{root}/namespaces/{namespace}/{k.plural}"


def is_subset(desired: Any, live: Any) -> bool:
    """Whether every field we render already has that value on the live object (server fields ignored)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, x) for d, x in zip(desired, live, strict=True))
        )
    return bool(desired == live)


def merge_patch_for(desired: Obj) -> Obj:
    """The parts of a rendered object the operator owns: labels, owner references and the spec."""
    meta = desired["metadata"]
    patch: Obj = {"metadata": {"labels": meta.get("labels", {})}}
    if "ownerReferences" in meta:
        patch["metadata"]["ownerReferences"] = meta["ownerReferences"]
    if "spec" in desired:
        patch["spec"] = desired["spec"]
    return patch


class Kube:
    """A thin JSON client: every method returns parsed objects or raises :class:`KubeError`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG)."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(client.ApiClient())

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*params, _request_timeout=30)
            response.read()  # type: ignore[no-untyped-call]
        except client.ApiException as exc:
            raise KubeError(exc.status or 0, str(exc.reason)) from exc
        except Exception as exc:  # connection errors of urllib3 and friends
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from exc
        data: bytes = response.data or b""
        if response.status >= 400:
            raise KubeError(response.status, data.decode(errors="replace")[:500])
        return json.loads(data) if data else None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        return await asyncio.to_thread(self._call, method, path, body, query, content_type)

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            found: Obj = await self.call("GET", f"{collection_path(kind, namespace)}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[Obj]:
        found = await self.call("GET", collection_path(kind, namespace), query={"labelSelector": label_selector})
        items: list[Obj] = found.get("items") or []
        return items

    async def create(self, obj: Obj) -> Obj | None:
        """Create; an object that already exists is not an error (a watch may lag behind our writes)."""
        namespace = obj["metadata"]["namespace"]
        try:
            created: Obj = await self.call("POST", collection_path(obj["kind"], namespace), body=obj)
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise
        return created

    async def patch(self, kind: str, namespace: str, name: str, patch: Obj) -> Obj:
        path = f"{collection_path(kind, namespace)}/{name}"
        patched: Obj = await self.call("PATCH", path, body=patch, content_type="application/merge-patch+json")
        return patched

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job takes its pods along); False if it was gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self.call("DELETE", f"{collection_path(kind, namespace)}/{name}", body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def ensure(self, desired: Obj) -> Outcome:
        """Create the object, or merge-patch the fields we own when they drifted."""
        meta = desired["metadata"]
        live = await self.get(desired["kind"], meta["namespace"], meta["name"])
        if live is None:
            await self.create(desired)
            return "created"
        patch = merge_patch_for(desired)
        if is_subset(patch, live):
            return "unchanged"
        await self.patch(desired["kind"], meta["namespace"], meta["name"], patch)
        return "patched"
