"""Pure translation of a Pod spec into what a local process needs: argv, environment, mounts, probes.

No I/O here: ConfigMaps and Secrets are passed in as plain dicts, so every rule (`$(VAR)` expansion,
fieldRef, envFrom prefixes, optional references, volume items) is unit-tested without a cluster.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

Obj = dict[str, Any]
# (kind, namespace, name) -> data (Secret data already base64-decoded to str); None = not found
Refs = Mapping[tuple[str, str, str], Mapping[str, str] | None]

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """The container cannot be configured (a kubelet reports CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes variable expansion: `$(VAR)` if defined, `$$` escapes, unknown references stay as is."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(replace, text)


@dataclass(frozen=True)
class PodFacts:
    """Runtime facts a fieldRef may read that are not in the stored spec."""

    pod_ip: str
    host_ip: str


def field_value(pod: Obj, path: str, facts: PodFacts) -> str:
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return str(simple[path])
    if match := _FIELD.match(path):
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")


_CPU_UNITS = {"m": 0.001, "": 1.0}
_MEM_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
_MEM_UNITS["Ti"] = 2**40


def quantity(value: str) -> float:
    """A Kubernetes quantity ('500m', '4Gi', '2') as a number of base units."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not match:
        raise ConfigError(f"bad quantity {value!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _CPU_UNITS:
        return number * _CPU_UNITS[suffix]
    if suffix in _MEM_UNITS:
        return number * _MEM_UNITS[suffix]
    raise ConfigError(f"bad quantity suffix in {value!r}")


def resource_field_value(container: Obj, ref: Obj) -> str:
    kind, _, name = ref["resource"].partition(".")
    raw = container.get("resources", {}).get(kind, {}).get(name)
    if raw is None:
        return "0"
    divisor = quantity(ref.get("divisor", "1"))
    return str(max(1, int(-(-quantity(raw) // divisor))))


def _lookup(refs: Refs, kind: str, namespace: str, ref: Obj, key: str | None) -> str | None:
    data = refs.get((kind, namespace, ref["name"]))
    optional = bool(ref.get("optional", False))
    if data is None:
        if optional:
            return None
        raise ConfigError(f"{kind} {namespace}/{ref['name']} not found")
    if key is None:
        return ""
    if key not in data:
        if optional:
            return None
        raise ConfigError(f"key {key!r} not found in {kind} {namespace}/{ref['name']}")
    return data[key]


def resolve_env(pod: Obj, container: Obj, refs: Refs, facts: PodFacts) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source and _lookup(refs, kind, namespace, source[key], None) is not None:
                for name, value in (refs.get((kind, namespace, source[key]["name"])) or {}).items():
                    env[prefix + name] = value
    for var in container.get("env", []):
        resolved = _env_value(pod, container, var, env, refs, facts)
        if resolved is not None:
            env[var["name"]] = resolved
    return env


def _env_value(pod: Obj, container: Obj, var: Obj, env: Mapping[str, str], refs: Refs, facts: PodFacts) -> str | None:
    if "valueFrom" not in var:
        return expand(str(var.get("value", "")), env)
    source = var["valueFrom"]
    namespace = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"], facts)
    if "resourceFieldRef" in source:
        return resource_field_value(container, source["resourceFieldRef"])
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return _lookup(refs, "ConfigMap", namespace, ref, ref["key"])
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return _lookup(refs, "Secret", namespace, ref, ref["key"])
    raise ConfigError(f"unsupported valueFrom for env {var['name']}: {sorted(source)}")


def resolve_argv(container: Obj, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expansion; an image entrypoint is unknown here, so command is required."""
    command = [expand(part, env) for part in container.get("command", [])]
    args = [expand(part, env) for part in container.get("args", [])]
    if not command:
        if not args:
            raise ConfigError(f"container {container['name']} has no command (image entrypoints are unknown here)")
        return args
    return command + args


def pre_stop_command(container: Obj) -> list[str] | None:
    """lifecycle.preStop.exec's command (httpGet and sleep hooks are not emulated: none is rendered)."""
    hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec")
    return list(hook["command"]) if hook and hook.get("command") else None


def referenced_objects(pod: Obj) -> set[tuple[str, str, str]]:
    """Every (kind, namespace, name) the pod's env and volumes read, to fetch before starting it."""
    namespace = pod["metadata"]["namespace"]
    found: set[tuple[str, str, str]] = set()
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    for container in containers:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                found.add(("ConfigMap", namespace, source["configMapRef"]["name"]))
            if "secretRef" in source:
                found.add(("Secret", namespace, source["secretRef"]["name"]))
        for var in container.get("env", []):
            source = var.get("valueFrom", {})
            if "configMapKeyRef" in source:
                found.add(("ConfigMap", namespace, source["configMapKeyRef"]["name"]))
            if "secretKeyRef" in source:
                found.add(("Secret", namespace, source["secretKeyRef"]["name"]))
    for volume in pod["spec"].get("volumes", []):
        for kind, key, name_key in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName")):
            if key in volume:
                found.add((kind, namespace, volume[key][name_key]))
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                found.add(("ConfigMap", namespace, source["configMap"]["name"]))
            if "secret" in source:
                found.add(("Secret", namespace, source["secret"]["name"]))
    return found


def decode_secret(secret: Obj) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode(errors="replace") for k, v in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data


# ---- volumes ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VolumeFile:
    path: str  # relative to the volume root
    content: str
    mode: int


@dataclass(frozen=True)
class VolumePlan:
    """How the agent materializes one pod volume."""

    name: str
    kind: str  # "dir" (emptyDir on disk), "tmpfs" (emptyDir medium Memory), "files", "hostPath"
    size_bytes: int | None = None
    files: tuple[VolumeFile, ...] = ()
    host_path: str = ""
    host_path_type: str = ""  # "", DirectoryOrCreate, Directory, FileOrCreate, File, CharDevice, ...
    # Projected service-account tokens are requested at start: (audience, expirationSeconds, path)
    token_requests: tuple[tuple[str, int, str], ...] = ()


@dataclass(frozen=True)
class MountPlan:
    volume: str
    target: str
    sub_path: str = ""
    read_only: bool = False


def _item_files(data: Mapping[str, str], source: Obj, default_mode: int) -> list[VolumeFile]:
    items = source.get("items")
    if not items:
        return [VolumeFile(path=k, content=v, mode=default_mode) for k, v in sorted(data.items())]
    files = []
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ConfigError(f"key {item['key']!r} missing for volume item {item['path']}")
        files.append(VolumeFile(path=item["path"], content=data[item["key"]], mode=item.get("mode", default_mode)))
    return files


def _object_files(refs: Refs, kind: str, namespace: str, name: str, source: Obj, mode: int) -> list[VolumeFile]:
    data = refs.get((kind, namespace, name))
    if data is None:
        if source.get("optional"):
            return []
        raise ConfigError(f"{kind} {namespace}/{name} for a volume not found")
    return _item_files(data, source, mode)


def _projected(pod: Obj, volume: Obj, refs: Refs, facts: PodFacts) -> VolumePlan:
    namespace = pod["metadata"]["namespace"]
    spec = volume["projected"]
    mode = spec.get("defaultMode", 0o644)
    files: list[VolumeFile] = []
    tokens: list[tuple[str, int, str]] = []
    for source in spec.get("sources", []):
        if "configMap" in source:
            cm = source["configMap"]
            files += _object_files(refs, "ConfigMap", namespace, cm["name"], cm, mode)
        elif "secret" in source:
            sec = source["secret"]
            files += _object_files(refs, "Secret", namespace, sec["name"], sec, mode)
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items", []):
                value = field_value(pod, item["fieldRef"]["fieldPath"], facts) if "fieldRef" in item else ""
                files.append(VolumeFile(path=item["path"], content=value, mode=mode))
        elif "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            tokens.append((sat.get("audience", ""), int(sat.get("expirationSeconds", 3600)), sat["path"]))
    return VolumePlan(name=volume["name"], kind="files", files=tuple(files), token_requests=tuple(tokens))


def plan_volumes(pod: Obj, refs: Refs, facts: PodFacts) -> list[VolumePlan]:
    """Each pod volume as a VolumePlan; unsupported kinds (PVCs, ...) raise ConfigError with the reason."""
    namespace = pod["metadata"]["namespace"]
    plans: list[VolumePlan] = []
    for volume in pod["spec"].get("volumes", []):
        name = volume["name"]
        if "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            size = int(quantity(empty["sizeLimit"])) if empty.get("sizeLimit") else None
            kind = "tmpfs" if empty.get("medium") == "Memory" else "dir"
            plans.append(VolumePlan(name=name, kind=kind, size_bytes=size))
        elif "configMap" in volume:
            cm = volume["configMap"]
            files = _object_files(refs, "ConfigMap", namespace, cm["name"], cm, cm.get("defaultMode", 0o644))
            plans.append(VolumePlan(name=name, kind="files", files=tuple(files)))
        elif "secret" in volume:
            sec = volume["secret"]
            files = _object_files(refs, "Secret", namespace, sec["secretName"], sec, sec.get("defaultMode", 0o644))
            plans.append(VolumePlan(name=name, kind="files", files=tuple(files)))
        elif "projected" in volume:
            plans.append(_projected(pod, volume, refs, facts))
        elif "downwardAPI" in volume:
            wrapped = {"name": name, "projected": {"sources": [{"downwardAPI": volume["downwardAPI"]}]}}
            plans.append(_projected(pod, wrapped, refs, facts))
        elif "hostPath" in volume:
            host = volume["hostPath"]
            plans.append(VolumePlan(name, "hostPath", host_path=host["path"], host_path_type=host.get("type", "")))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise ConfigError(f"volume {name}: kind {kinds} is not supported by the e2e node agent")
    return plans


def plan_mounts(container: Obj) -> list[MountPlan]:
    return [
        MountPlan(
            volume=m["name"],
            target=str(PurePosixPath(m["mountPath"])),
            sub_path=m.get("subPath", ""),
            read_only=bool(m.get("readOnly", False)),
        )
        for m in container.get("volumeMounts", [])
    ]


# ---- probes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A probe with the kubelet's defaults filled in."""

    kind: str  # "httpGet" | "tcpSocket" | "exec"
    port: int = 0
    host: str = ""
    """httpGet.host: connect there from the node's host network instead of to the pod IP."""
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def named_port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ConfigError(f"container {container['name']}: named port {port!r} not declared")


def parse_probe(container: Obj, spec: Obj | None) -> Probe | None:
    if not spec:
        return None
    timing = {
        "initial_delay_s": float(spec.get("initialDelaySeconds", 0)),
        "period_s": float(spec.get("periodSeconds", 10)),
        "timeout_s": float(spec.get("timeoutSeconds", 1)),
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        http = spec["httpGet"]
        headers = tuple((h["name"], h["value"]) for h in http.get("httpHeaders", []))
        return Probe(
            kind="httpGet",
            port=named_port(container, http["port"]),
            host=http.get("host", ""),
            path=http.get("path", "/"),
            scheme=http.get("scheme", "HTTP"),
            headers=headers,
            **timing,  # type: ignore[arg-type]
        )
    if "tcpSocket" in spec:
        port = named_port(container, spec["tcpSocket"]["port"])
        return Probe(kind="tcpSocket", port=port, **timing)  # type: ignore[arg-type]
    if "exec" in spec:
        return Probe(kind="exec", command=tuple(spec["exec"]["command"]), **timing)  # type: ignore[arg-type]
    raise ConfigError(f"container {container['name']}: unsupported probe {sorted(spec)}")


# ---- service names (the agent's stand-in for cluster DNS) ----------------------------------------------


@dataclass(frozen=True)
class PodAddress:
    namespace: str
    name: str
    labels: Mapping[str, str]
    ip: str


@dataclass(frozen=True)
class Endpoint:
    """One address of a Service's EndpointSlice (from the real controller-manager): a pod on any node."""

    namespace: str
    service: str
    pod: str
    ip: str
    ready: bool


def slice_endpoints(endpoint_slice: Obj) -> list[Endpoint]:
    """An EndpointSlice's addresses; a missing `ready` condition means ready (discovery.k8s.io/v1)."""
    meta = endpoint_slice["metadata"]
    service = (meta.get("labels") or {}).get("kubernetes.io/service-name")
    if not service:
        return []
    found = []
    for item in endpoint_slice.get("endpoints") or []:
        addresses = item.get("addresses") or []
        if addresses:
            ready = (item.get("conditions") or {}).get("ready") is not False
            pod = (item.get("targetRef") or {}).get("name", "")
            found.append(Endpoint(meta["namespace"], service, pod, addresses[0], ready))
    return found


def service_targets(
    services: list[Obj], pods: list[PodAddress], endpoints: list[Endpoint]
) -> dict[tuple[str, str], str]:
    """(namespace, service) -> one address for its name: a ready endpoint on any node first, else a
    matching pod of this node (its sandbox is up before the EndpointSlice lists it); by pod name within
    each, so the choice is stable."""
    targets: dict[tuple[str, str], str] = {}
    for svc in services:
        if svc.get("spec", {}).get("type") == "ExternalName":
            continue
        namespace, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        selector = svc.get("spec", {}).get("selector") or {}
        candidates = [(not e.ready, e.pod, e.ip) for e in endpoints if (e.namespace, e.service) == (namespace, name)]
        if selector:
            local = (p for p in pods if p.namespace == namespace and p.ip and _selects(selector, p.labels))
            candidates += [(True, p.name, p.ip) for p in local]
        if candidates:
            targets[(namespace, name)] = min(candidates)[2]
    return targets


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def render_hosts(pod: PodAddress, hostname: str, targets: Mapping[tuple[str, str], str]) -> str:
    """A pod's /etc/hosts: itself, then every Service by its cluster DNS names (short name in its namespace)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if pod.ip:
        lines.append(f"{pod.ip}\t{hostname}")
    for (namespace, name), ip in sorted(targets.items()):
        names = [f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
        if namespace == pod.namespace:
            names.append(name)
        lines.append(f"{ip}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"
