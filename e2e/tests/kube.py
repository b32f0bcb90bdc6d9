"""Small synchronous helpers the tests share: waiting, reading objects, applying YAML."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self, TypeVar

import httpx
import yaml

from e2e import real_node
from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.node_config import NodeLayout

T = TypeVar("T")
Obj = dict[str, Any]
log = logging.getLogger(__name__)


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.3) -> T:
    """Poll until `check` returns something truthy; the error says what was awaited and the last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:  # the object may not exist yet
            last = err
        else:
            if last:
                found: T = last
                return found
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {str(last)[:2000]}")


def get(cp: ControlPlane, path: str) -> Obj | None:
    with cp.http() as client:
        resp = client.get(path)
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    result: Obj = resp.json()
    return result


def _selected(collection: str, selector: str, watch_from: str = "") -> str:
    """The path that lists a collection's objects matching a label selector, or watches them from a version."""
    query = f"labelSelector={selector}"
    if watch_from:  # the server ends each watch after a few seconds, so a stop is seen soon
        query += f"&watch=1&resourceVersion={watch_from}&timeoutSeconds=5"
    return f"{collection}?{query}"


def _slices_path(namespace: str, service: str, watch_from: str = "") -> str:
    collection = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    return _selected(collection, f"kubernetes.io/service-name={service}", watch_from)


def _ready(slices: Iterable[Obj]) -> list[str]:
    return sorted(
        address
        for eps in slices
        for ep in eps.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for address in ep.get("addresses", [])
    )


def ready_addresses(cp: ControlPlane, namespace: str, service: str) -> list[str]:
    """The ready endpoint addresses of a Service, from its EndpointSlices (what kube-proxy would route to)."""
    return _ready((get(cp, _slices_path(namespace, service)) or {}).get("items", []))


@dataclass
class Background:
    """``run`` goes on in a daemon thread of its own while the ``with`` block runs; ``stop`` is set on the
    way out, and the thread gets ``join_s`` to see it."""

    join_s: ClassVar[float] = 30
    stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    thread: threading.Thread | None = field(default=None, kw_only=True)

    def run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=self.join_s)


@dataclass
class _Watched(Background):
    """Objects listed once, then followed by a watch from the listing's resourceVersion in a thread of its
    own for as long as the ``with`` block runs. A subclass says what it lists (``path``), what a listing
    and each event change in its state (``listed``, ``apply_event``), and what it does when the watch
    cannot resume (``resume``)."""

    cp: ControlPlane
    namespace: str
    version: str = field(default="", kw_only=True)  # the last resourceVersion seen: where the watch resumes

    def path(self, watch_from: str = "") -> str:
        raise NotImplementedError

    def listed(self, items: list[Obj]) -> None:
        raise NotImplementedError

    def apply_event(self, event: Obj) -> str:
        """The event applied; the version to resume from, "" when the watch cannot resume (an ERROR such
        as 410 Gone)."""
        raise NotImplementedError

    def resume(self) -> str:
        """After an event the watch cannot resume from: list again, and follow from that listing."""
        return self.relist()

    def relist(self) -> str:
        listing = get(self.cp, self.path()) or {}
        self.listed(listing.get("items", []))
        return str(listing["metadata"]["resourceVersion"])

    def __enter__(self) -> Self:
        self.version = self.relist()
        return super().__enter__()

    def run(self) -> None:
        while self.version and not self.stop.is_set():
            try:
                with self.cp.http() as client, client.stream("GET", self.path(self.version)) as resp:
                    resp.raise_for_status()
                    for line in resp.iter_lines():
                        if not line.strip():
                            continue
                        self.version = self.apply_event(json.loads(line)) or self.resume()
                        if not self.version:
                            return
            except httpx.HTTPError as err:  # reconnect from the last version seen
                log.warning("watch of %s interrupted (%s); resuming at %s", self.path(), err, self.version)
                time.sleep(0.2)


@dataclass
class ReadyEndpoints(_Watched):
    """A Service's ready endpoint addresses, kept current by a watch of its EndpointSlices as kube-proxy
    keeps them (a poll would go on sending to a removed endpoint for up to one interval)."""

    service: str
    slices: dict[str, Obj] = field(default_factory=dict)  # name -> EndpointSlice
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> list[str]:
        with self.lock:
            return _ready(self.slices.values())

    def path(self, watch_from: str = "") -> str:
        return _slices_path(self.namespace, self.service, watch_from)

    def listed(self, items: list[Obj]) -> None:
        with self.lock:
            self.slices = {s["metadata"]["name"]: s for s in items}

    def apply_event(self, event: Obj) -> str:
        obj = event["object"]
        if event["type"] == "ERROR":
            return ""
        with self.lock:
            if event["type"] == "DELETED":
                self.slices.pop(obj["metadata"]["name"], None)
            elif event["type"] != "BOOKMARK":
                self.slices[obj["metadata"]["name"]] = obj
        return str(obj["metadata"]["resourceVersion"])


@dataclass
class ContainerRuntimes(_Watched):
    """Which container runtime ran each container of every pod of the cluster, by the scheme of its
    ``containerID`` (``containerd://...`` from a real node's kubelet), as a watch of all pods reports them:
    a pod that lived between two polls is seen too. ``namespace`` is unused (all of them are watched)."""

    containers: dict[str, set[str]] = field(default_factory=dict)  # runtime -> {"<ns>/<pod>/<container>"}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def path(self, watch_from: str = "") -> str:
        return _selected("/api/v1/pods", "", watch_from)

    def listed(self, items: list[Obj]) -> None:
        for item in items:
            self.record(item)

    def apply_event(self, event: Obj) -> str:
        obj = event["object"]
        if event["type"] == "ERROR":  # e.g. 410 Gone: list again (what lived meanwhile is not seen)
            log.warning("the pod watch of the whole cluster failed: %s", obj)
            return ""
        if event["type"] != "BOOKMARK":
            self.record(obj)
        return str(obj["metadata"]["resourceVersion"])

    def record(self, pod: Obj) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        with self.lock:
            for field_name in ("initContainerStatuses", "containerStatuses"):
                for container in status.get(field_name) or []:
                    runtime, sep, _ = str(container.get("containerID") or "").partition("://")
                    if sep:
                        seen = self.containers.setdefault(runtime, set())
                        seen.add(f"{meta['namespace']}/{meta['name']}/{container['name']}")

    def others(self, runtime: str) -> dict[str, set[str]]:
        """The containers of any runtime but ``runtime``."""
        with self.lock:
            return {name: set(found) for name, found in self.containers.items() if name != runtime}


def pod(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    return get(cp, f"/api/v1/namespaces/{namespace}/pods/{name}")


def pods(cp: ControlPlane, namespace: str, selector: str = "") -> list[Obj]:
    query = f"?labelSelector={selector}" if selector else ""
    listing = get(cp, f"/api/v1/namespaces/{namespace}/pods{query}") or {}
    items: list[Obj] = listing.get("items", [])
    return items


@dataclass
class PodWatch(_Watched):
    """Every change to the pods a selector matches, as the API server's watch reports it.

    Sampling pods with repeated lists misses a state that lasts less than one list (a pod deleted and
    replaced between two polls); a watch sees each change in order, so what it records is exact.
    """

    selector: str
    deleting: set[str] = field(default_factory=set)  # names of pods seen with a deletionTimestamp or deleted
    fewest_ready: int | None = None  # fewest pods Ready and not being deleted, after any change
    current: dict[str, Obj] = field(default_factory=dict)  # uid -> pod
    failure: str = ""  # why the watch could not go on (then what it recorded is incomplete)

    def __exit__(self, *_: object) -> None:
        super().__exit__()
        assert not self.failure, self.failure

    def path(self, watch_from: str = "") -> str:
        return _selected(f"/api/v1/namespaces/{self.namespace}/pods", self.selector, watch_from)

    def listed(self, items: list[Obj]) -> None:
        self.current = {p["metadata"]["uid"]: p for p in items}
        self.record()

    def resume(self) -> str:
        """A new listing would hide the changes missed: the watch stops, and ``__exit__`` fails."""
        return ""

    def apply_event(self, event: Obj) -> str:
        obj = event["object"]
        if event["type"] == "ERROR":  # e.g. 410 Gone: changes were missed, so nothing can be resumed exactly
            self.failure = f"the pod watch in {self.namespace} failed: {obj}"
            return ""
        if event["type"] == "BOOKMARK":
            return str(obj["metadata"]["resourceVersion"])
        meta = obj["metadata"]
        if event["type"] == "DELETED":
            self.current.pop(meta["uid"], None)
            self.deleting.add(meta["name"])
        else:
            self.current[meta["uid"]] = obj
            if meta.get("deletionTimestamp"):
                self.deleting.add(meta["name"])
        self.record()
        return str(meta["resourceVersion"])

    def record(self) -> None:
        ready = [p for p in self.current.values() if is_true(p, "Ready") and not p["metadata"].get("deletionTimestamp")]
        self.fewest_ready = len(ready) if self.fewest_ready is None else min(self.fewest_ready, len(ready))


def serving_pod(cp: ControlPlane, namespace: str, name: str) -> Obj:
    """The pod a PDDeployment's status names as its serving pod."""
    obj = pdd(cp, namespace, name)
    assert obj is not None, f"PDDeployment {namespace}/{name}"
    found = pod(cp, namespace, obj["status"]["podName"])
    assert found is not None, f"the serving pod of {namespace}/{name}"
    return found


def container_pids(cp: ControlPlane, serving: Obj, names: Iterable[str]) -> dict[str, int]:
    """The pid each named container's pid 1 has now, as the machine numbers it: found in the container's
    cgroup on its node (by the container ids the pod's status has now)."""
    meta = serving["metadata"]
    layout = NodeLayout.from_dict(cp.extras["real_nodes"][serving["spec"]["nodeName"]]["layout"])
    now = pod(cp, meta["namespace"], meta["name"]) or serving
    ids = {c["name"]: str(c.get("containerID", "")) for c in now["status"].get("containerStatuses", [])}
    return {name: real_node.container_pid(layout, ids.get(name, "")) for name in names}


def kill_container(cp: ControlPlane, serving: Obj, name: str, sig: int = signal.SIGKILL) -> int:
    """Kill a container as a crash would, so that its kubelet restarts it; returns the pid. The signal goes
    to the container's pid 1 (SIGKILL of it ends its whole pid namespace)."""
    pid = container_pids(cp, serving, [name])[name]
    os.kill(pid, sig)
    return pid


def ready_pod(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    """The pod if its Ready condition is True."""
    obj = pod(cp, namespace, name)
    return obj if is_true(obj, "Ready") else None


def condition(obj: Obj | None, kind: str) -> Obj | None:
    for cond in (obj or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Obj | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return bool(cond and cond.get("status") == "True")


def container_status(obj: Obj | None, name: str) -> Obj:
    for status in (obj or {}).get("status", {}).get("containerStatuses", []) or []:
        if status["name"] == name:
            return dict(status)
    return {}


PodSecurityLevel = Literal["privileged", "baseline", "restricted"]
POD_SECURITY = "pod-security.kubernetes.io"


def pod_security_labels(enforce: PodSecurityLevel) -> dict[str, str]:
    """The labels a cluster admin sets: enforce a level, warn and audit against restricted (the usual rollout)."""
    return {
        f"{POD_SECURITY}/enforce": enforce,
        f"{POD_SECURITY}/warn": "restricted",
        f"{POD_SECURITY}/audit": "restricted",
    }


def create_namespace(cp: ControlPlane, name: str, enforce: PodSecurityLevel = "baseline") -> str:
    """A namespace labelled for Pod Security admission as a user would label it; returns its name."""
    manifest: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    manifest["metadata"]["labels"] = pod_security_labels(enforce)
    cp.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    return name


def simulated_example(name: str) -> Obj:
    """examples/simulated-write.yaml, named ``name``: the deployment most tests start from and adjust."""
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / "simulated-write.yaml").read_text())
    obj["metadata"]["name"] = name
    return obj


@contextlib.contextmanager
def applied_in(cp: ControlPlane, namespace: str, objs: Iterable[Obj]) -> Iterator[str]:
    """``objs`` applied together in a new namespace (Pod Security baseline, as the suite's other
    namespaces), which is deleted afterwards."""
    create_namespace(cp, namespace)
    for obj in objs:
        apply(cp, json.dumps(obj), namespace)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@contextlib.contextmanager
def simulated_deployment(cp: ControlPlane, namespace: str, name: str) -> Iterator[str]:
    """``simulated_example(name)`` without the goodput probe, Ready in a new namespace (``applied_in``)."""
    obj = simulated_example(name)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    with applied_in(cp, namespace, [obj]):
        wait_pdd_ready(cp, namespace, name, timeout_s=180)
        yield namespace


def apply(cp: ControlPlane, manifest: str, namespace: str) -> str:
    return cp.kubectl("apply", "-n", namespace, "-f", "-", input_text=manifest)


GROUP_PATH = "/apis/pd.serving.dev/v1alpha1"


def pdd(cp: ControlPlane, namespace: str, name: str) -> Obj | None:
    return get(cp, f"{GROUP_PATH}/namespaces/{namespace}/pddeployments/{name}")


def phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase", ""))


def wait_pdd_ready(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 120) -> Obj:
    """Ready phase for the current generation (so a stale Ready from before a change does not count)."""

    seen: list[Obj] = []

    def ready() -> Obj | None:
        obj = pdd(cp, namespace, name)
        if obj is None:
            return None
        seen[:] = [obj]
        if phase(obj) != "Ready":
            return None
        observed = obj["status"].get("observedGeneration")
        return obj if observed == obj["metadata"]["generation"] else None

    try:
        return wait_for(ready, timeout_s, f"PDDeployment {namespace}/{name} Ready")
    except AssertionError as err:  # say where it stood: phase, conditions and each replica's message
        status = seen[0].get("status", {}) if seen else {}
        brief = {k: status.get(k) for k in ("phase", "message", "conditions", "replicaStatuses")}
        raise AssertionError(f"{err}; its last status: {json.dumps(brief)[:6000]}") from None


def stream_completion(pod_ip: str, port: int = 8000) -> str:
    """A streamed completion through the proxy's API port; returns the generated text."""
    base = f"http://{pod_ip}:{port}"
    model = httpx.get(f"{base}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Disaggregate prefill and decode.", "max_tokens": 8, "stream": True}
    chunks: list[str] = []
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60, trust_env=False) as resp:
        assert resp.status_code == 200, resp.read()
        chunks = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert chunks and chunks[-1] == "[DONE]", chunks
    return "".join(json.loads(c)["choices"][0].get("text", "") for c in chunks[:-1])


def pdd_events(cp: ControlPlane, namespace: str, name: str, reason: str) -> list[Obj]:
    """The Events of one reason about a PDDeployment."""
    selector = f"involvedObject.kind=PDDeployment,involvedObject.name={name},reason={reason}"
    listing = get(cp, f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}") or {}
    found: list[Obj] = listing.get("items", [])
    return found


def children_admitted(cp: ControlPlane, namespace: str, name: str, status: str) -> Obj | None:
    """The PDDeployment's ChildrenAdmitted condition once it has this status."""
    found = condition(pdd(cp, namespace, name), "ChildrenAdmitted")
    return found if found and found["status"] == status else None


def credential(cp: ControlPlane, serving: Obj, key: str) -> str:
    """One key (engine-key, admin-key) of the serving pod's PDDeployment's credentials Secret."""
    meta = serving["metadata"]
    name = f"{meta['labels']['pd.serving.dev/deployment']}-credentials"
    secret = get(cp, f"/api/v1/namespaces/{meta['namespace']}/secrets/{name}")
    assert secret is not None, "the operator creates the credentials Secret before the pod"
    return base64.b64decode(secret["data"][key]).decode()


def proxy_status(cp: ControlPlane, serving: Obj) -> Obj:
    """A serving pod's proxy admin /status, read as the operator reads it: with the admin key of the
    PDDeployment's credentials Secret (off the pod's loopback /status asks for it)."""
    headers = {"Authorization": f"Bearer {credential(cp, serving, 'admin-key')}"}
    resp = httpx.get(f"http://{serving['status']['podIP']}:8001/status", headers=headers, timeout=30, trust_env=False)
    resp.raise_for_status()
    found: Obj = resp.json()
    return found
