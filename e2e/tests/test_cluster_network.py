"""Several nodes, one pod network: pods on different nodes reach each other, Service names find ready pods
on any node (through the real controller-manager's EndpointSlices), each node in its own pod CIDR."""

from __future__ import annotations

import functools
import ipaddress
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from e2e import netns
from e2e.cluster import ControlPlane
from e2e.stack import POOL_KEY
from e2e.tests.kube import Obj, apply, get, pod, ready_pod, wait_for

POOL = "net"

PODS = """
apiVersion: v1
kind: Pod
metadata: {name: web-a, labels: {app: web}}
spec:
  containers:
  - name: web
    image: runtime
    command: ["python", "-m", "http.server", "8080"]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, labels: {app: web}}
spec:
  containers:
  - name: never-ready
    image: runtime
    command: ["sleep", "3600"]
    readinessProbe: {exec: {command: ["false"]}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 8080}]
"""

CLIENT = """
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: client
    image: runtime
    command:
    - python
    - -c
    - |
      import sys, time, urllib.request
      def get(host):
          for _ in range(40):
              try:
                  return urllib.request.urlopen(f"http://{host}:8080/", timeout=2).status
              except OSError as err:
                  last = err
                  time.sleep(0.5)
          sys.exit(f"{host}: {last}")
      for host in sys.argv[1:]:
          assert get(host) == 200, host
      print("reached", *sys.argv[1:])
    - WEB_IP
    - web
    - web.NS.svc.cluster.local
"""


def _on_node(manifest: str, node: str) -> list[Obj]:
    """The manifest's pods pinned to `node` of the pool (tolerating the pool's taint)."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            doc["spec"]["tolerations"] = [{"key": POOL_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return docs


def _apply(cp: ControlPlane, docs: list[Obj], namespace: str) -> None:
    apply(cp, yaml.safe_dump_all(docs), namespace)


def test_pods_on_different_nodes_reach_each_other_by_ip_and_service_name(
    cp: ControlPlane, namespace: str, node_pool: Callable[[str, int], list[str]]
) -> None:
    first, second = node_pool(POOL, 2)
    cidrs = {}
    for node in (first, second):
        found = get(cp, f"/api/v1/nodes/{node}")
        assert found is not None and found["metadata"]["labels"][POOL_KEY] == POOL
        cidrs[node] = ipaddress.IPv4Network(found["spec"]["podCIDR"])
    assert cidrs[first] != cidrs[second] and cidrs[first].subnet_of(ipaddress.IPv4Network(cp.cluster_cidr))

    web, never_ready, service = _on_node(PODS, first)
    never_ready["spec"]["nodeSelector"] = {"kubernetes.io/hostname": second}  # local to the client
    _apply(cp, [web, never_ready, service], namespace)
    served = wait_for(functools.partial(ready_pod, cp, namespace, "web-a"), 60, "web-a Ready")
    web_ip = served["status"]["podIP"]
    assert ipaddress.ip_address(web_ip) in cidrs[first]

    client = _on_node(CLIENT.replace("WEB_IP", web_ip).replace("NS", namespace), second)
    _apply(cp, client, namespace)

    def finished() -> Obj | None:
        obj = pod(cp, namespace, "client")
        return obj if obj and obj["status"].get("phase") in ("Succeeded", "Failed") else None

    done = wait_for(finished, 90, "client pod to finish")
    assert ipaddress.ip_address(done["status"]["podIP"]) in cidrs[second]
    log = cp.kubectl("logs", "-n", namespace, "client")
    assert done["status"]["phase"] == "Succeeded", log
    assert f"reached {web_ip} web web.{namespace}.svc.cluster.local" in log


def test_the_cluster_bridge_keeps_its_mac_when_a_port_comes_and_goes() -> None:
    """A bridge whose MAC followed its lowest port's would change it when a pod goes, and the other pods'
    traffic to the gateway would stall until they resolve it again."""
    bridge = f"pdmac{secrets.token_hex(2)}"
    port, address = f"{bridge}p", Path(f"/sys/class/net/{bridge}/address")
    netns.create_bridge(bridge)
    try:
        before = address.read_text()
        lowest = ["address", "00:00:00:00:00:01", "type", "veth", "peer", "name", f"{bridge}q"]
        subprocess.run(["ip", "link", "add", port, *lowest], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", port, "master", bridge], check=True, capture_output=True)
        assert address.read_text() == before
        subprocess.run(["ip", "link", "del", port], check=True, capture_output=True)
        assert address.read_text() == before
    finally:
        netns.delete_bridge(bridge)
