"""The node agent behaves like a kubelet for plain pods: the ground the operator tests stand on."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import httpx
import pytest

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import NODE_NAME, Stack
from e2e.tests.kube import Obj, apply, container_status, get, is_true, pod, ready_pod, wait_for


def _terminated(cp: ControlPlane, namespace: str, name: str, container: str) -> Obj:
    def done() -> Obj | None:
        obj = pod(cp, namespace, name)
        if obj and obj["status"].get("phase") in ("Succeeded", "Failed"):
            return dict(container_status(obj, container)["state"]["terminated"])
        return None

    return wait_for(done, 60, f"pod {name} to finish")


def test_node_looks_like_an_mi300x_node(cp: ControlPlane) -> None:
    node = get(cp, f"/api/v1/nodes/{NODE_NAME}")
    assert node is not None
    assert node["status"]["capacity"]["amd.com/gpu"] == "8"
    assert node["status"]["allocatable"]["amd.com/gpu"] == "8"
    labels = node["metadata"]["labels"]
    assert labels["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X_OAM"
    assert labels["amd.com/gpu.device-id"] == "74a1"
    assert labels["amd.com/gpu.compute-memory-partition"] == "spx_nps1"
    # NICs through their device plugins (the API server writes the shared plugin's 1000 as "1k")
    for resource, count in (("rdma/hca_shared_devices_a", "1k"), ("amd.com/nic", "8")):
        assert node["status"]["capacity"][resource] == count and node["status"]["allocatable"][resource] == count
    assert is_true(node, "Ready")
    lease = wait_for(
        lambda: get(cp, f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE_NAME}"), 15, "lease"
    )
    assert lease["spec"]["holderIdentity"] == NODE_NAME


RESOLVE_POD = """
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {greeting: hello, key: from-configmap}
---
apiVersion: v1
kind: Secret
metadata: {name: sec}
stringData: {password: s3cret}
---
apiVersion: v1
kind: Pod
metadata: {name: resolve, labels: {app: resolve}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: ghcr.io/pd-serving/pd-runtime:0.1.0
    command: ["sh", "-c"]
    args:
    - |
      {
        echo "ip=$POD_IP name=$NAME ns=$NS"
        echo "cm=$FROM_CM secret=$FROM_SECRET prefixed=$PRE_greeting expanded=$EXPANDED"
        echo "file=$(cat /config/greeting) secretfile=$(cat /secret/password)"
        echo "shm=$(stat -f -c %T /dev/shm) pdctl=$(command -v pdctl) vllm=$(command -v vllm)"
        echo "secret-ro=$(touch /secret/x 2>/dev/null && echo no || echo yes)"
      } > /dev/termination-log
    env:
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: FROM_CM, valueFrom: {configMapKeyRef: {name: cfg, key: key}}}
    - {name: FROM_SECRET, valueFrom: {secretKeyRef: {name: sec, key: password}}}
    - {name: EXPANDED, value: "$(NAME)-$(FROM_CM)"}
    envFrom:
    - {prefix: PRE_, configMapRef: {name: cfg}}
    volumeMounts:
    - {name: config, mountPath: /config}
    - {name: secret, mountPath: /secret, readOnly: true}
    - {name: shm, mountPath: /dev/shm}
  volumes:
  - {name: config, configMap: {name: cfg}}
  - {name: secret, secret: {secretName: sec}}
  - {name: shm, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
"""


def test_pod_spec_is_resolved_like_a_kubelet(cp: ControlPlane, namespace: str) -> None:
    apply(cp, RESOLVE_POD, namespace)
    terminated = _terminated(cp, namespace, "resolve", "main")
    assert terminated["exitCode"] == 0
    obj = pod(cp, namespace, "resolve")
    assert obj is not None and obj["status"]["phase"] == "Succeeded"
    message = str(terminated["message"])
    assert f"ip={obj['status']['podIP']} name=resolve ns={namespace}" in message
    assert "cm=from-configmap secret=s3cret prefixed=hello expanded=resolve-from-configmap" in message
    assert "file=hello secretfile=s3cret" in message
    assert "shm=tmpfs" in message
    assert f"pdctl={sys.prefix}/bin/pdctl vllm={REPO_ROOT}/e2e/shims/vllm" in message
    assert "secret-ro=yes" in message


def test_volumes_over_the_install_keep_pdctl_working(cp: ControlPlane, namespace: str) -> None:
    """emptyDirs over /tmp (as the proxy has) and over this checkout's parent hide the node's files there,
    yet `pdctl` from this project still runs: the agent binds its install back in place."""
    targets = sorted({"/tmp", str(REPO_ROOT.parent)})
    hidden = cp.kubeconfig  # under the system temp directory, normally /tmp
    script = (
        f'pdctl --help > /dev/null && echo "pdctl-runs hidden=$(test -e {hidden} && echo no || echo yes)"'
        " > /dev/termination-log"
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hiding"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "runtime",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": f"v{i}", "mountPath": t} for i, t in enumerate(targets)],
                }
            ],
            "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(len(targets))],
        },
    }
    apply(cp, json.dumps(manifest), namespace)
    terminated = _terminated(cp, namespace, "hiding", "main")
    assert terminated["exitCode"] == 0, terminated
    expected = "yes" if str(hidden).startswith(tuple(targets)) else "no"
    assert f"pdctl-runs hidden={expected}" in str(terminated["message"])


WEB_PODS = """
apiVersion: v1
kind: Pod
metadata: {name: web-a, labels: {app: web-a}}
spec:
  containers:
  - name: web
    image: runtime
    command: ["python", "-m", "http.server", "8080"]
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-b, labels: {app: web-b}}
spec:
  containers:
  - name: web
    image: runtime
    command: ["python", "-m", "http.server", "8080"]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web-a}
  ports: [{port: 8080}]
"""

CLIENT_POD = """
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
      import urllib.request
      for host in ("web", "web.NS.svc", "web.NS.svc.cluster.local"):
          assert urllib.request.urlopen(f"http://{host}:8080/", timeout=5).status == 200, host
      print("all names resolved")
"""


def test_pods_get_own_network_and_services_resolve(cp: ControlPlane, namespace: str) -> None:
    apply(cp, WEB_PODS, namespace)
    ready = [wait_for(functools.partial(ready_pod, cp, namespace, n), 60, n) for n in ("web-a", "web-b")]
    ips = {p["status"]["podIP"] for p in ready}
    assert len(ips) == 2, "each pod has its own network namespace and address"
    for ip in ips:  # the same port in two pods, both reachable from the node
        assert httpx.get(f"http://{ip}:8080/", timeout=5, trust_env=False).status_code == 200
    apply(cp, CLIENT_POD.replace("NS", namespace), namespace)
    terminated = _terminated(cp, namespace, "client", "client")
    assert terminated["exitCode"] == 0, terminated


CRASHING_POD = """
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  restartPolicy: Always
  containers:
  - name: main
    image: runtime
    command: ["sh", "-c", "echo boom > /dev/termination-log; exit 3"]
"""


def test_restart_policy_always_restarts_with_termination_message(cp: ControlPlane, namespace: str) -> None:
    apply(cp, CRASHING_POD, namespace)

    def restarted() -> Obj | None:
        status = container_status(pod(cp, namespace, "crash"), "main")
        return status if status.get("restartCount", 0) >= 2 else None

    status = wait_for(restarted, 60, "two restarts")
    last = status["lastState"]["terminated"]
    assert last["exitCode"] == 3 and last["message"].strip() == "boom"


PROBED_POD = """
apiVersion: v1
kind: Pod
metadata: {name: probed}
spec:
  containers:
  - name: main
    image: runtime
    command: ["sh", "-c", "sleep 1; touch /scratch/ready; exec python -m http.server 8080"]
    volumeMounts: [{name: work, mountPath: /scratch}]
    readinessProbe: {exec: {command: ["test", "-f", "/scratch/ready"]}, periodSeconds: 1}
    livenessProbe: {httpGet: {path: /, port: 9999}, initialDelaySeconds: 3, periodSeconds: 1, failureThreshold: 2}
  volumes: [{name: work, emptyDir: {}}]
"""


def test_exec_readiness_and_liveness_restart(cp: ControlPlane, namespace: str) -> None:
    apply(cp, PROBED_POD, namespace)
    wait_for(lambda: is_true(pod(cp, namespace, "probed"), "Ready"), 60, "exec readiness probe")

    def restarted() -> bool:
        return int(container_status(pod(cp, namespace, "probed"), "main").get("restartCount", 0)) >= 1

    wait_for(restarted, 60, "restart after the liveness probe fails")
    events = json.loads(cp.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    assert any(e["reason"] == "Unhealthy" and "Liveness" in e["message"] for e in events)


SLEEP_POD = """
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: runtime
    command: ["sh", "-c", "echo hello-from-pod; exec sleep 3600"]
"""


def _agent_netns(stack: Stack) -> list[str]:
    run_id = json.loads((stack.agent_dir() / "agent.json").read_text())["run_id"]
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"pd-{run_id}-")]


def test_logs_and_deletion_stop_processes(stack: Stack, cp: ControlPlane, namespace: str) -> None:
    before = set(_agent_netns(stack))
    apply(cp, SLEEP_POD, namespace)
    wait_for(lambda: is_true(pod(cp, namespace, "sleeper"), "Ready"), 60, "sleeper Ready")
    assert len(set(_agent_netns(stack)) - before) == 1
    wait_for(lambda: "hello-from-pod" in cp.kubectl("logs", "-n", namespace, "sleeper"), 20, "kubectl logs")
    cp.kubectl("delete", "pod", "-n", namespace, "sleeper", "--timeout=30s")
    assert pod(cp, namespace, "sleeper") is None
    wait_for(lambda: not set(_agent_netns(stack)) - before, 10, "the pod's network namespace removed")


PRESTOP_POD = """
apiVersion: v1
kind: Pod
metadata: {name: held}
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - name: gate
    image: runtime
    command: ["sh", "-c", "touch /scratch/gate;
      trap 'sleep 1; echo gate-gone >> /order/log; rm /scratch/gate; exit 0' TERM; while true; do sleep 0.1; done"]
    volumeMounts: [{name: work, mountPath: /scratch}, {name: order, mountPath: /order}]
  - name: held
    image: runtime
    command: ["sh", "-c", "trap 'echo held-term >> /order/log; exit 0' TERM; while true; do sleep 0.1; done"]
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "while [ -e /scratch/gate ]; do sleep 0.1; done; echo hook-done >> /order/log"]}
    volumeMounts: [{name: work, mountPath: /scratch}, {name: order, mountPath: /order}]
  volumes:
  - {name: work, emptyDir: {}}
  - {name: order, hostPath: {path: /prestop-order, type: DirectoryOrCreate}}
"""


@pytest.mark.pod_security("privileged")  # the hostPath that outlives the pod
def test_prestop_hook_runs_in_the_container_before_its_sigterm(stack: Stack, cp: ControlPlane, namespace: str) -> None:
    """As the kubelet: every container is stopped at once, but one with a preStop hook gets SIGTERM only
    when its hook (in its own mounts: the emptyDir it shares) has returned; here after the other has gone."""
    log = stack.agent_dir() / "node-root" / "prestop-order" / "log"
    log.unlink(missing_ok=True)
    apply(cp, PRESTOP_POD, namespace)
    wait_for(lambda: is_true(pod(cp, namespace, "held"), "Ready"), 60, "held Ready")
    cp.kubectl("delete", "pod", "-n", namespace, "held", "--timeout=60s")
    assert log.read_text().split() == ["gate-gone", "hook-done", "held-term"]


HUNG_HOOK_POD = """
apiVersion: v1
kind: Pod
metadata: {name: hung}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: runtime
    command: ["sh", "-c", "exec sleep 3600"]
    lifecycle: {preStop: {exec: {command: ["sleep", "3600"]}}}
"""


def test_a_prestop_hook_that_outlives_the_grace_is_cut_and_the_container_stopped(
    cp: ControlPlane, namespace: str
) -> None:
    apply(cp, HUNG_HOOK_POD, namespace)
    wait_for(lambda: is_true(pod(cp, namespace, "hung"), "Ready"), 60, "hung Ready")
    cp.kubectl("delete", "pod", "-n", namespace, "hung", "--timeout=60s")
    events = json.loads(cp.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    assert any(e["reason"] == "FailedPreStopHook" and "timed out" in e["message"] for e in events)


JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: runtime
        command: ["sh", "-c", "echo '{\\"ok\\": true}' > /dev/termination-log"]
"""


def test_job_completes_through_the_job_controller(cp: ControlPlane, namespace: str) -> None:
    apply(cp, JOB, namespace)

    def complete() -> Obj | None:
        job = get(cp, f"/apis/batch/v1/namespaces/{namespace}/jobs/once")
        return job if is_true(job, "Complete") else None

    job = wait_for(complete, 60, "Job Complete")
    assert job["status"]["succeeded"] == 1


VLLM_POD = """
apiVersion: v1
kind: Pod
metadata: {name: not-serve}
spec:
  restartPolicy: Never
  containers:
  - name: engine
    image: runtime
    command: ["vllm", "--version"]
"""


def test_vllm_shim_emulates_only_serve(cp: ControlPlane, namespace: str) -> None:
    apply(cp, VLLM_POD, namespace)
    terminated = _terminated(cp, namespace, "not-serve", "engine")
    assert terminated["exitCode"] == 2
    assert "only 'vllm serve' is emulated" in str(terminated["message"])


LIST_DEVICES = (
    "{ echo dri=$(ls /dev/dri 2>/dev/null | tr '\\n' ,); echo kfd=$(test -e /dev/kfd && echo yes || echo no);"
    " echo ib=$(ls /dev/infiniband 2>/dev/null | tr '\\n' ,); echo sysib=$(ls /sys/class/infiniband | tr '\\n' ,);"
    " echo kfdnodes=$(ls /sys/class/kfd/kfd/topology/nodes/*/properties 2>/dev/null | wc -l);"
    " echo dev=$(ls /dev | tr '\\n' ,); } > /dev/termination-log"
)


def _device_container(name: str, limits: dict[str, str], privileged: bool = False) -> Obj:
    container: Obj = {"name": name, "image": "runtime", "command": ["sh", "-c", LIST_DEVICES]}
    container["resources"] = {"limits": limits}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return container


def _listing(message: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in message.strip().splitlines())


@pytest.mark.pod_security("privileged")  # a privileged container / hostNetwork, as a user must
def test_device_plugins_give_each_container_its_own_devices(cp: ControlPlane, namespace: str) -> None:
    """As the AMD GPU plugin and the RDMA plugins allocate: disjoint GPUs, shared HCAs, exclusive NICs."""
    containers = [
        _device_container("shared-rdma", {"amd.com/gpu": "4", "rdma/hca_shared_devices_a": "1"}),
        _device_container("nic", {"amd.com/gpu": "4", "amd.com/nic": "2"}),
        _device_container("plain", {}),
        _device_container("privileged", {}, privileged=True),
    ]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "devices"},
        "spec": {"restartPolicy": "Never", "containers": containers},
    }
    apply(cp, json.dumps(manifest), namespace)
    seen = {c["name"]: _listing(str(_terminated(cp, namespace, "devices", c["name"])["message"])) for c in containers}
    shared, nic, plain, privileged = (seen[c["name"]] for c in containers)
    gpus = {name: set(view["dri"].strip(",").split(",")) for name, view in (("shared", shared), ("nic", nic))}
    assert len(gpus["shared"]) == len(gpus["nic"]) == 8, gpus  # 4 card + 4 renderD nodes each
    assert not gpus["shared"] & gpus["nic"], "two containers never share a GPU"
    assert shared["kfd"] == nic["kfd"] == "yes" and shared["kfdnodes"] == nic["kfdnodes"] == "6"  # 2 CPUs + 4 GPUs
    assert shared["ib"].count("uverbs") == 8 and len(shared["sysib"].strip(",").split(",")) == 8
    assert nic["ib"].count("uverbs") == 2 and len(nic["sysib"].strip(",").split(",")) == 2
    assert (plain["dri"], plain["kfd"], plain["ib"], plain["sysib"], plain["kfdnodes"]) == ("", "no", "", "", "2")
    assert "termination-log" in plain["dev"] and "null" in plain["dev"] and "kfd" not in plain["dev"]
    assert privileged["dri"].count("renderD") == 8 and privileged["ib"].count("uverbs") == 8


HOST_NETWORK_POD = """
apiVersion: v1
kind: Pod
metadata: {name: host-net}
spec:
  hostNetwork: true
  containers:
  - name: web
    image: runtime
    command: ["sh", "-c", "readlink /proc/self/ns/net > /dev/termination-log; exec python -m http.server 8080"]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""


@pytest.mark.pod_security("privileged")  # a privileged container / hostNetwork, as a user must
def test_host_network_pods_live_in_the_nodes_namespace_not_the_machines(
    stack: Stack, cp: ControlPlane, namespace: str
) -> None:
    apply(cp, HOST_NETWORK_POD, namespace)
    ready = wait_for(functools.partial(ready_pod, cp, namespace, "host-net"), 60, "host-net Ready")
    node = get(cp, f"/api/v1/nodes/{NODE_NAME}")
    assert node is not None
    internal_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    assert ready["status"]["podIP"] == ready["status"]["hostIP"] == internal_ip
    assert httpx.get(f"http://{internal_ip}:8080/", timeout=5, trust_env=False).status_code == 200
    node_netns = json.loads((stack.agent_dir() / "agent.json").read_text())["node_netns"]
    expected = f"net:[{os.stat(f'/run/netns/{node_netns}').st_ino}]"
    assert expected != os.readlink("/proc/self/ns/net"), "the node's host network is not the machine's"
    meta = ready["metadata"]
    written = stack.agent_dir() / "pods" / f"{namespace}_host-net_{meta['uid'][:8]}" / "containers" / "web"
    assert (written / "termination-log").read_text().strip() == expected
