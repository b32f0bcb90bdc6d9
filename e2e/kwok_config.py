"""Pure: what KWOK (sigs.k8s.io/kwok v0.8.0, `kwok` run as a process) needs to play fake MI300X nodes.

KWOK plays the kubelet of the Nodes it manages through the API only: no processes, no containers. A Node
is ours to create (`fake_node`): the capacity of an 8-GPU MI300X server as its device plugins advertise
it (amd.com/gpu, the shared RDMA resource, amd.com/nic) and the cpu and memory of a `MachineShape`, the
annotation by which `kwok --manage-nodes-with-annotation-selector` takes it over, and a `spec.podCIDR` on
loopback, so that whoever dials a pod's address (the operator reads each proxy's admin /status) gets
"connection refused" at once and no packet leaves the machine. (The controller-manager's node IPAM cannot
mark a pod CIDR outside the cluster's as taken: its log says so for each fake node, retrying with backoff;
nothing else follows from it.)

What happens to the managed objects is KWOK's stages (`stages`): the `kwok` binary embeds none (only
kwokctl does), so they are given to it in its `--config` file, trimmed from the defaults of v0.8.0
(kustomize/stage/node/fast, node/heartbeat-with-lease, pod/fast): a Node becomes Ready, its status is
refreshed every ten minutes while KWOK renews its Lease (`--node-lease-duration-seconds`), a pod bound to
it becomes Running and Ready at once, a Job's pod Succeeded, and a pod being deleted goes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from e2e.node_config import MachineShape
from pd_operator import quantity

Obj = dict[str, Any]

VERSION = "v0.8.0"  # e2e/tools/kwok, built by `e2e/build-control-plane.sh --kwok`
MANAGED_ANNOTATION = "kwok.x-k8s.io/node"  # KWOK's own convention for the nodes it plays
MANAGED_VALUE = "fake"
LEASE_DURATION_S = 40  # the kubelet's default nodeLeaseDurationSeconds
POD_CIDR_BASE = "127.214"  # loopback: a pod's address refuses connections at once (nothing listens)
MAX_NODES = 250  # one loopback /24 each under POD_CIDR_BASE
PODS_PER_NODE = 110  # the kubelet's default maxPods

GPU_RESOURCE = "amd.com/gpu"
SHARED_RDMA_RESOURCE = "rdma/hca_shared_devices_a"
SHARED_RDMA_CAPACITY = 1000  # the shared-device plugin's rdmaHcaMax default
NIC_RESOURCE = "amd.com/nic"
GPUS_PER_NODE = 8
NICS_PER_NODE = 8


def node_name(index: int) -> str:
    return f"kwok-mi300x-{index}"


def pod_cidr(index: int) -> str:
    """The loopback /24 of node `index`, its pods' addresses (KWOK takes them from the Node's spec.podCIDR)."""
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} out of range 0..{MAX_NODES - 1}")
    return f"{POD_CIDR_BASE}.{index}.0/24"


def node_ip(index: int) -> str:
    """The node's InternalIP (its pods' hostIP): on loopback too, one past the pods' /24s."""
    return f"{POD_CIDR_BASE}.{MAX_NODES}.{index + 1}"


def capacity(shape: MachineShape) -> dict[str, str]:
    """What an MI300X server's kubelet reports, with its device plugins' resources."""
    return {
        "cpu": str(shape.cpus),
        "memory": f"{shape.memory_gib}Gi",
        "pods": str(PODS_PER_NODE),
        "ephemeral-storage": "3Ti",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        GPU_RESOURCE: str(GPUS_PER_NODE),
        SHARED_RDMA_RESOURCE: str(SHARED_RDMA_CAPACITY),
        NIC_RESOURCE: str(NICS_PER_NODE),
    }


def labels(name: str) -> dict[str, str]:
    """The well-known labels of a node, and those the AMD node labeller gives an MI300X one."""
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "mi300x-8gpu",
        "feature.node.kubernetes.io/amd-gpu": "true",
        "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
        "amd.com/gpu.device-id": "74a1",
        "amd.com/gpu.vram": "192G",
        "type": "kwok",
    }


def fake_node(index: int, shape: MachineShape) -> Obj:
    """Node `index` as created (a Node's status may be set on create): KWOK's stages make it Ready."""
    name = node_name(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels(name), "annotations": {MANAGED_ANNOTATION: MANAGED_VALUE}},
        "spec": {"podCIDR": pod_cidr(index), "podCIDRs": [pod_cidr(index)]},
        "status": {
            "capacity": capacity(shape),
            "allocatable": capacity(shape),
            "addresses": [{"type": "InternalIP", "address": node_ip(index)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": f"kwok {VERSION}",
                "containerRuntimeVersion": f"kwok://{VERSION}",
                "kubeletVersion": f"kwok-{VERSION}",
                "kubeProxyVersion": f"kwok-{VERSION}",
                "kernelVersion": f"kwok-{VERSION}",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def nodes_needed(pods: int, pod_requests: Mapping[str, float], shape: MachineShape) -> int:
    """How many fake nodes hold `pods` pods of `pod_requests` each (cpu in cores, memory in GiB, devices in
    units): the most any one resource, or the kubelet's pod limit, asks for; at least one."""
    node = {
        "cpu": float(shape.cpus),
        "memory": float(shape.memory_gib),
        GPU_RESOURCE: float(GPUS_PER_NODE),
        SHARED_RDMA_RESOURCE: float(SHARED_RDMA_CAPACITY),
        NIC_RESOURCE: float(NICS_PER_NODE),
    }
    unknown = set(pod_requests) - set(node)
    if unknown:
        raise ValueError(f"a fake node has no {sorted(unknown)}")
    if pods <= 0:
        return 1
    per_node = [math.floor(node[r] / amount) for r, amount in pod_requests.items() if amount > 0]
    per_node.append(PODS_PER_NODE)
    fit = min(per_node)
    if fit == 0:
        raise ValueError(f"one pod asking {dict(pod_requests)} fits no fake node")
    return math.ceil(pods / fit)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """What the scheduler counts of a pod (cpu in cores, memory in GiB, devices in units): its containers'
    requests summed, or an init container's where that is more."""
    spec = pod.get("spec") or {}

    def requests(containers: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        found = []
        for container in containers:
            asked = (container.get("resources") or {}).get("requests") or {}
            found.append({r: float(quantity.parse(str(v))) / (2**30 if r == "memory" else 1) for r, v in asked.items()})
        return found

    total: dict[str, float] = {}
    for asked in requests(spec.get("containers") or []):
        for resource, amount in asked.items():
            total[resource] = total.get(resource, 0.0) + amount
    for asked in requests(spec.get("initContainers") or []):
        for resource, amount in asked.items():
            total[resource] = max(total.get(resource, 0.0), amount)
    return total


# ---- stages ------------------------------------------------------------------------------------------------

_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

_POD_READY = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $uid := or .metadata.uid "" }}
{{ $name := or .metadata.name "" }}
{{ $namespace := or .metadata.namespace "" }}
{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) $uid $name $namespace }}
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_COMPLETE = """\
{{ $now := Now }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""

_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'


def _expr(key: str, operator: str, values: Sequence[str] = ()) -> Obj:
    found: Obj = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


def _stage(name: str, kind: str, match: list[Obj], next_: Obj, delay_ms: tuple[int, int] | None = None) -> Obj:
    spec: Obj = {"resourceRef": {"apiGroup": "v1", "kind": kind}, "selector": {"matchExpressions": match}}
    if delay_ms is not None:
        # a heartbeat: matched again at once after it played (not on the API server's next event), so the
        # delay runs again
        spec["delay"] = {"durationMilliseconds": delay_ms[0], "jitterDurationMilliseconds": delay_ms[1]}
        spec["immediateNextStage"] = True
    spec["next"] = next_
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages() -> list[Obj]:
    """The Stage objects of `kwok --config`: nodes Ready and kept so (with Leases), pods Running and Ready,
    Job pods Succeeded, deleted pods gone."""
    running = _expr(".status.phase", "In", ["Running"])
    not_deleting = _expr(".metadata.deletionTimestamp", "DoesNotExist")
    return [
        _stage(
            "node-initialize",
            "Node",
            [_expr(_READY, "NotIn", ["True"])],
            {"statusTemplate": _NODE_CONDITIONS + "phase: Running\n"},
        ),
        _stage(  # with Leases a kubelet posts its status every 5 min; KWOK's default is 10 min, jittered
            "node-heartbeat-with-lease",
            "Node",
            [running, _expr(_READY, "In", ["True"])],
            {"statusTemplate": _NODE_CONDITIONS},
            delay_ms=(600_000, 610_000),
        ),
        _stage(
            "pod-ready",
            "Pod",
            [not_deleting, _expr(".status.phase", "In", ["Pending"]), _expr(_READY, "NotIn", ["True"])],
            {"statusTemplate": _POD_READY},
        ),
        _stage(
            "pod-complete",
            "Pod",
            [not_deleting, running, _expr(".metadata.ownerReferences.[].kind", "In", ["Job"])],
            {"statusTemplate": _POD_COMPLETE},
        ),
        _stage("pod-delete", "Pod", [_expr(".metadata.deletionTimestamp", "Exists")], {"delete": True}),
    ]


def argv(binary: str, kubeconfig: str, config: str) -> list[str]:
    """The `kwok` command line: the nodes of our annotation only (a real node beside them stays its
    kubelet's), the stages of `config`, Leases renewed; no CRDs, no server (no port to take)."""
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
        f"--node-lease-duration-seconds={LEASE_DURATION_S}",
    ]
