"""The few Kubernetes API calls the handlers make, as plain JSON over the official client's transport.

One generic path per verb (get, list, create, server-side apply, patch, delete) keyed by kind, so every child object
goes through the same code; the client library supplies authentication (in-cluster service account or
kubeconfig). Calls run in a worker thread so they never block kopf's event loop. Children are kept in
place by server-side apply under one field manager: one request creates a missing object, repairs the
fields the operator owns, or (the usual case) changes nothing, without a GET first.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config

from pd_operator.api import API_VERSION, PLURAL
from pd_operator.refusals import DETAIL_LIMIT, ApiFailure, failure_from_status
from pd_operator.settings import FIELD_MANAGER

log = logging.getLogger(__name__)
Obj = dict[str, Any]
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON


@dataclass(frozen=True)
class Kind:
    api_version: str
    plural: str


KINDS: dict[str, Kind] = {
    "Pod": Kind("v1", "pods"),
    "Service": Kind("v1", "services"),
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "Job": Kind("batch/v1", "jobs"),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "ResourceClaimTemplate": Kind("resource.k8s.io/v1", "resourceclaimtemplates"),
    "ResourceClaim": Kind("resource.k8s.io/v1", "resourceclaims"),
    "Deployment": Kind("apps/v1", "deployments"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "InferencePool": Kind("inference.networking.k8s.io/v1", "inferencepools"),
    "PDDeployment": Kind(API_VERSION, PLURAL),
    "HorizontalPodAutoscaler": Kind("autoscaling/v2", "horizontalpodautoscalers"),
}
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached), ``failure``
    the server's own account of it (refusals.py reads the policy and fields from it)."""

    def __init__(self, failure: ApiFailure) -> None:
        super().__init__(str(failure))
        self.status = failure.code
        self.failure = failure


def _body(data: bytes | str | None) -> Any:
    try:
        return json.loads(data or b"")
    except ValueError:
        return (data.decode(errors="replace") if isinstance(data, bytes) else data or "")[:DETAIL_LIMIT]


def collection_path(kind: str, namespace: str) -> str:
    k = KINDS[kind]
    root = "/api/v1" if k.api_version == "v1" else f"/apis/{k.api_version}"
    return f"{root}/namespaces/{namespace}/{k.plural}"


class Kube:
    """A thin JSON client: every method returns parsed objects or raises :class:`KubeError`."""

    def __init__(self, api: client.ApiClient, field_manager: str = FIELD_MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager

    @classmethod
    def from_environment(cls, field_manager: str = FIELD_MANAGER) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG)."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(), field_manager)

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
            raise KubeError(failure_from_status(exc.status or 0, _body(exc.body) or str(exc.reason))) from exc
        except Exception as exc:  # connection errors of urllib3 and friends
            raise KubeError(ApiFailure(0, message=f"{type(exc).__name__}: {exc}")) from exc
        data: bytes = response.data or b""
        if response.status >= 400:
            raise KubeError(failure_from_status(response.status, _body(data)))
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

    async def items(self, kind: str, namespace: str, label_selector: str = "") -> list[Obj]:
        """The objects of ``kind`` with the labels (one LIST, no watch)."""
        query = {"labelSelector": label_selector} if label_selector else None
        listing: Obj = await self.call("GET", collection_path(kind, namespace), query=query)
        return list(listing.get("items") or [])

    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        """Set replicas through the scale subresource, as `kubectl scale` and HorizontalPodAutoscalers do."""
        body = {"spec": {"replicas": replicas}}
        await self.call(
            "PATCH", f"{collection_path(kind, namespace)}/{name}/scale", body=body, content_type=MERGE_PATCH
        )

    async def patch(self, kind: str, namespace: str, name: str, body: Obj) -> Obj:
        """A strategic merge patch (lists such as ownerReferences merge by key); a ``metadata.uid`` in ``body``
        makes it a precondition: another object of that name fails with 422, as ``apply``."""
        patched: Obj = await self.call(
            "PATCH", f"{collection_path(kind, namespace)}/{name}", body=body, content_type=STRATEGIC_MERGE_PATCH
        )
        return patched

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

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply: the operator's field manager owns what ``obj`` sets (forced on conflict). A
        ``metadata.uid`` in ``obj`` makes it a precondition: another object of that name fails with 422."""
        meta = obj["metadata"]
        path = f"{collection_path(obj['kind'], meta['namespace'])}/{meta['name']}"
        query = {"fieldManager": self.field_manager, "force": "true"}
        applied: Obj = await self.call("PATCH", path, body=obj, query=query, content_type=APPLY_PATCH)
        return applied

    async def delete(
        self, kind: str, namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete with background propagation (a Job takes its pods along); False if it was gone.
        `grace_seconds=0` removes a pod at once, without waiting for its kubelet (a lost node's pod);
        `uid` deletes only that object (a precondition: an object that replaced it fails with 409)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.call("DELETE", f"{collection_path(kind, namespace)}/{name}", body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
