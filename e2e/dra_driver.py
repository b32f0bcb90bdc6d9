"""The fake AMD GPU DRA driver (`gpu.amd.com`) of a real node, and what its Helm chart would install.

`pd-fake-dra-driver` (e2e/tools/devplugins, built by e2e/build-device-plugins.sh) runs in the node as a
plugin (`Stack.start_real_node(plugins=...)`): it registers with the node's kubelet through the plugin
watcher (`/var/lib/kubelet/plugins_registry`), answers the kubelet's NodePrepareResources and
NodeUnprepareResources on `/var/lib/kubelet/plugins/gpu.amd.com/dra.sock`, recording each call as a JSON
line in the node's logs, and publishes the node's ResourceSlice with the devices of e2e/resourceslices.py,
as its own ServiceAccount. Containers get no device nodes from it: the node's containerd 1.6 has no CDI
(docs/e2e-real-node.md, "Plugins").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e import device_plugins, resourceslices
from e2e.cluster import ControlPlane
from e2e.node_config import NodeLayout
from e2e.real_node import NodePlugin

Obj = dict[str, Any]
BINARY = "pd-fake-dra-driver"
NAMESPACE = "pd-e2e-dra-driver"
ACCOUNT = "gpu-dra-driver"


@dataclass(frozen=True)
class DriverFiles:
    """What every node's driver reads: the devices to publish and its ServiceAccount's kubeconfig."""

    devices: Path
    kubeconfig: Path


def cluster_objects() -> list[Obj]:
    """The driver's cluster-wide part, as its chart has it: the DeviceClass, and a ServiceAccount that may
    read ResourceClaims (to prepare them) and Nodes (its slices' owner) and manage ResourceSlices."""
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}
    return [
        resourceslices.device_class(),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": ACCOUNT},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ACCOUNT},
            "subjects": [subject],
        },
    ]


def install(cp: ControlPlane, gpus: int = 8) -> DriverFiles:
    """The driver's cluster-wide part applied, and the files its node plugins read written in the
    cluster's work directory: the devices of a node with `gpus` GPUs and the ServiceAccount's kubeconfig."""
    manifest = {"apiVersion": "v1", "kind": "List", "items": cluster_objects()}
    cp.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
    devices = cp.workdir / "dra-devices.json"
    devices.write_text(json.dumps(resourceslices.devices(gpus), indent=2))
    kubeconfig = cp.service_account_kubeconfig(NAMESPACE, ACCOUNT, cp.workdir / "dra-driver.kubeconfig")
    return DriverFiles(devices=devices, kubeconfig=kubeconfig)


def events_file(layout: NodeLayout) -> Path:
    return Path(layout.logs_dir) / "dra-events.jsonl"


def real_node_plugin(files: DriverFiles) -> NodePlugin:
    """The driver as a real node's plugin: in the node's mount namespace the kubelet's plugin directories
    are at their fixed paths, the driver's defaults."""
    path = str(device_plugins.binary(BINARY))
    return lambda layout: [
        path,
        f"-node={layout.name}",
        f"-devices={files.devices}",
        f"-kubeconfig={files.kubeconfig}",
        f"-events={events_file(layout)}",
    ]


def events(layout: NodeLayout) -> list[Obj]:
    """The kubelet's calls the node's driver answered, oldest first: op (prepare, unprepare), claim (its
    UID), namespace, name, devices, error."""
    path = events_file(layout)
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]
