"""A small asyncio client for the Kubernetes API (httpx), just what the node agent needs.

List+watch with resourceVersion bookkeeping, strategic-merge status patches and deletes. Kept tiny on
purpose: the agent plays the kubelet, so it talks the raw REST API like the kubelet does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

log = logging.getLogger(__name__)

Obj = dict[str, Any]
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class KubeClient:
    """Async REST client authenticated by a bearer token (from a kubeconfig)."""

    def __init__(self, server: str, token: str, ca_pem: bytes, user_agent: str = "pd-e2e") -> None:
        self.server = server
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata=ca_pem.decode())
        headers = {"Authorization": f"Bearer {token}", "User-Agent": user_agent}
        timeout = httpx.Timeout(30.0, read=None)
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=20)
        self._http = httpx.AsyncClient(base_url=server, verify=ctx, headers=headers, timeout=timeout, limits=limits)

    @classmethod
    def from_kubeconfig(cls, path: Path, user_agent: str = "pd-e2e") -> KubeClient:
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        if "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"])
        else:
            ca = Path(cluster["certificate-authority"]).read_bytes()
        return cls(cluster["server"], user["token"], ca, user_agent)

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        resp = await self._http.request(method, path, **kwargs)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.text)
        result: Obj = resp.json() if resp.content else {}
        return result

    async def get(self, path: str, params: dict[str, str] | None = None) -> Obj:
        return await self.request("GET", path, params=params)

    async def get_or_none(self, path: str) -> Obj | None:
        try:
            return await self.get(path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, json=body)

    async def patch(self, path: str, body: Obj, content_type: str = SMP) -> Obj:
        data = json.dumps(body).encode()
        return await self.request("PATCH", path, content=data, headers={"Content-Type": content_type})

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        return await self.request("DELETE", path, json=body or {})

    async def watch(self, path: str, params: dict[str, str] | None = None) -> AsyncIterator[tuple[str, Obj]]:
        """List, then watch forever: yields ("ADDED"|"MODIFIED"|"DELETED"|"SYNCED", obj).

        "SYNCED" carries the whole list after each (re-)list, so callers can prune what disappeared.
        A 410 Gone or a dropped stream re-lists, as client-go's reflector does.
        """
        params = dict(params or {})
        while True:
            listing = await self.get(path, params)
            for item in listing.get("items", []):
                yield "ADDED", item
            yield "SYNCED", listing
            version = listing["metadata"]["resourceVersion"]
            try:
                async for kind, obj in self._watch_from(path, params, version):
                    yield kind, obj
            except (httpx.HTTPError, ApiError) as err:
                log.debug("watch %s restarts after %s", path, err)
                await asyncio.sleep(0.5)

    async def _watch_from(self, path: str, params: dict[str, str], version: str) -> AsyncIterator[tuple[str, Obj]]:
        while True:
            query = {**params, "watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
            query["timeoutSeconds"] = "300"
            async with self._http.stream("GET", path, params=query) as resp:
                if resp.status_code >= 400:
                    raise ApiError(resp.status_code, (await resp.aread()).decode())
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code", 500)), json.dumps(obj))
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        yield kind, obj
