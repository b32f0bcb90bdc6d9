"""`make demo`: the main job on a local control plane, from nothing to a serving, probed PDDeployment.

Builds (or reuses) the control plane and a real node (kubelet, containerd, kube-proxy, CoreDNS), imports
the images built from the project's Dockerfiles, installs the chart (the operator runs in-cluster from its
image), applies the simulated write-mode example, waits until it is Ready (showing progress), streams a
completion through the proxy, shows the goodput probe result and `kubectl get pdd`, then tears everything
down (or keeps it with --keep).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e.cluster import DEFAULT_STATE_DIR, REPO_ROOT, ControlPlane, binaries_dir, new_workdir
from e2e.node_config import MI300X_SERVER
from e2e.stack import OPERATOR_NAMESPACE, Stack

DEFAULT_EXAMPLE = REPO_ROOT / "examples" / "simulated-write.yaml"


class Progress:
    """Numbered steps with elapsed times on stdout."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.step = 0

    def __call__(self, text: str) -> None:
        self.step += 1
        self.say(f"[{self.step}] {text}")

    def say(self, text: str) -> None:
        sys.stdout.write(f"{time.monotonic() - self.start:6.1f}s  {text}\n")
        sys.stdout.flush()


def _pdd(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    with cp.http() as client:
        resp = client.get(f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pddeployments/{name}")
    resp.raise_for_status()
    result: dict[str, Any] = resp.json()
    return result


def _summary(obj: dict[str, Any]) -> str:
    status = obj.get("status") or {}
    conds = " ".join(
        f"{c['type']}={c['status']}" for c in status.get("conditions", []) if c["type"] not in ("SpecValid",)
    )
    return f"phase={status.get('phase', '-')} ready={status.get('ready', '-')} {conds}"


def wait_ready(cp: ControlPlane, namespace: str, name: str, say: Progress, timeout_s: float = 300) -> dict[str, Any]:
    """Poll the status and print each change until the phase is Ready."""
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        obj = _pdd(cp, namespace, name)
        line = _summary(obj)
        if line != last:
            say.say("    " + line)
            last = line
        if (obj.get("status") or {}).get("phase") == "Ready":
            return obj
        time.sleep(0.5)
    raise TimeoutError(f"{name} not Ready after {timeout_s:.0f}s")


def stream_request(pod_ip: str, say: Progress) -> None:
    base = f"http://{pod_ip}:8000"
    model = httpx.get(f"{base}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Why split prefill and decode?", "max_tokens": 24, "stream": True}
    say.say(f"    POST {base}/v1/completions (stream) model={model}")
    first = None
    started = time.monotonic()
    sys.stdout.write("    > ")
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60, trust_env=False) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.monotonic()
            sys.stdout.write(json.loads(line[6:])["choices"][0].get("text", ""))
            sys.stdout.flush()
    ttft = (first or time.monotonic()) - started
    sys.stdout.write(f"\n    time to first token {ttft * 1000:.0f} ms, total {time.monotonic() - started:.2f} s\n")


def wait_goodput(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 240) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        goodput = (_pdd(cp, namespace, name).get("status") or {}).get("goodput")
        if goodput:
            result: dict[str, Any] = goodput
            return result
        time.sleep(1)
    return None


def start_real(stack: Stack, say: Progress) -> None:
    """A real node and the chart, the operator running from its image."""
    stack.start_real_control_plane()
    say("starting node mi300x-0 (an MI300X server's CPUs and memory): containerd, kubelet, kube-proxy, CoreDNS")
    stack.start_real_node(shape=MI300X_SERVER)
    sys.stdout.write(stack.cp.kubectl("get", "nodes", "-o", "wide"))
    say("helm install charts/pd-operator (CRD, RBAC, the operator Deployment from its image)")
    stack.install_operator(in_cluster=True)
    sys.stdout.write(stack.cp.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide"))


def run(args: argparse.Namespace) -> int:
    say = Progress()
    say("control-plane binaries (built once, then reused from the cache)")
    bin_dir = binaries_dir("--node")
    workdir = DEFAULT_STATE_DIR if args.keep else new_workdir("pd-demo-")
    if args.keep and (workdir / "state.json").exists():
        sys.stderr.write(f"a cluster is already up in {workdir}; run `make cluster-down` first\n")
        return 1
    stack = Stack(ControlPlane(workdir=workdir, bin_dir=bin_dir), detach=args.keep)
    cp = stack.cp
    try:
        say(f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler ({bin_dir.name})")
        start_real(stack, say)
        example = yaml.safe_load(args.example.read_text())
        name, namespace = example["metadata"]["name"], "default"
        say(f"kubectl apply -f {args.example.relative_to(REPO_ROOT)}")
        sys.stdout.write("    " + cp.kubectl("apply", "-n", namespace, "-f", str(args.example)))
        say("waiting for Ready")
        obj = wait_ready(cp, namespace, name, say)
        say(f"streamed completion through the proxy of pod {obj['status']['podName']}")
        with cp.http() as client:
            pod = client.get(f"/api/v1/namespaces/{namespace}/pods/{obj['status']['podName']}").json()
        stream_request(pod["status"]["podIP"], say)
        if (example["spec"].get("goodputProbe") or {}).get("enabled"):
            say("goodput probe (a Job running `pdctl bench` against the Service) -> status.goodput")
            goodput = wait_goodput(cp, namespace, name)
            sys.stdout.write(f"    {json.dumps(goodput, indent=None)[:600] if goodput else 'no result yet'}\n")
        say("kubectl get pdd")
        sys.stdout.write(cp.kubectl("get", "pdd", "-n", namespace))
        if args.keep:
            sys.stdout.write(
                f"\nkept running. export KUBECONFIG={cp.kubeconfig} PATH={bin_dir}:$PATH\n"
                "stop it with: make cluster-down\n"
            )
            return 0
    except BaseException:
        sys.stderr.write(f"demo failed; logs were in {cp.workdir / 'logs'} and {cp.workdir / 'nodes'}\n")
        logs = [*cp.workdir.glob("logs/*.log"), *cp.workdir.glob("nodes/*/logs/kubelet.log")]
        for log in sorted(logs):
            if log.name.startswith("kubelet"):
                sys.stderr.write(f"--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-30:]) + "\n")
        operator_log = cp.kubectl("logs", "-n", OPERATOR_NAMESPACE, "deploy/pd-operator", "--tail=30", check=False)
        sys.stderr.write(f"--- the operator's log ---\n{operator_log}")
        stack.down()
        raise
    say("tearing down (pass --keep to leave it running)")
    stack.down()
    say("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE, help="PDDeployment to apply")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (stop: make cluster-down)")
    args = parser.parse_args(argv)
    args.example = args.example.resolve()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
