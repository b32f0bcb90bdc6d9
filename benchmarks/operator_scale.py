"""How fast and how cheaply does the operator reconcile PDDeployments on a real control plane?

Both parts run the control plane of the e2e suite (Kubernetes v1.36.3 built from source) and the operator
as a local process with the chart's ServiceAccount (`Stack.install_operator`, `Stack.start_operator`), so
its RSS is read from /proc.

Part 1 (latency, a real node: kubelet, containerd and runc, shaped as an MI300X server; simulated
engines with the `instant` profile run in the pod's containers): time from `kubectl apply` to the serving
pod existing and to the PDDeployment's phase Ready, several samples one after another. Needs what the
real node needs (root, the images of `make images`, built when missing; docs/e2e-real-node.md).
Part 2 (scale, KWOK nodes: fake MI300X nodes played by KWOK v0.8.0, e2e/kwok.py, whose pods become
Running and Ready through the API, without processes; as many nodes as the pods' requests need): 100
PDDeployments applied at once; time until all have their pod and until all are Ready; the operator's peak
RSS (VmHWM); and the API requests the operator makes per PDDeployment per minute at steady state, counted
exactly from the API server's audit log (Metadata level, the operator ServiceAccount's group only), and
among them the status patches of the unchanged PDDeployments (which must be zero). The window opens once
no status patch has come for 30 s (every deployment reached its final state) and lasts eleven minutes by
default, so that it includes at least one drift repair (every 300 s) of every deployment.

    .venv/bin/python benchmarks/operator_scale.py [--pdds 100] [--samples 3] [--steady-seconds 660]
        [--update-docs]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from e2e import kwok, kwok_config  # noqa: E402
from e2e.cluster import ControlPlane, binaries_dir, new_workdir  # noqa: E402
from e2e.node_config import MI300X_SERVER  # noqa: E402
from e2e.stack import OPERATOR_NAMESPACE, Stack  # noqa: E402
from pd_operator.commands.render import objects_for  # noqa: E402

DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- operator-scale:begin -->", "<!-- operator-scale:end -->"
GROUP = "/apis/pd.serving.dev/v1alpha1"
COMMAND = ".venv/bin/python benchmarks/operator_scale.py --update-docs"
QUIET_S = 30.0


def bench_pdd(name: str) -> dict[str, Any]:
    """The simulated write example with the instant profile and no goodput probe."""
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "simulated-write.yaml").read_text())
    obj["metadata"] = {"name": name}
    obj["spec"]["simulation"] = {"profile": "instant", "timeScale": 1}
    obj["spec"]["goodputProbe"] = {"enabled": False}
    return obj


def _list(cp: ControlPlane, path: str) -> list[dict[str, Any]]:
    with cp.http() as client:
        resp = client.get(path)
    resp.raise_for_status()
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def _ready_names(cp: ControlPlane, namespace: str) -> set[str]:
    items = _list(cp, f"{GROUP}/namespaces/{namespace}/pddeployments")
    return {i["metadata"]["name"] for i in items if (i.get("status") or {}).get("phase") == "Ready"}


def _pod_owners(cp: ControlPlane, namespace: str) -> set[str]:
    pods = _list(cp, f"/api/v1/namespaces/{namespace}/pods?labelSelector=app.kubernetes.io/component=serving")
    return {p["metadata"]["labels"].get("pd.serving.dev/deployment", "") for p in pods}


def _until(check: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not reached in {timeout_s:.0f}s")


def serving_pod_requests(namespace: str) -> dict[str, float]:
    """What the scheduler counts of one benchmark deployment's serving pod, as the operator renders it."""
    pods = [o for o in objects_for(bench_pdd("sizing"), namespace) if o["kind"] == "Pod"]
    return kwok_config.pod_requests(pods[0])


def start_operator(stack: Stack) -> None:
    """The chart installed, its operator Deployment at zero, the operator run as our process with the
    chart's ServiceAccount (its RSS readable)."""
    stack.install_operator(in_cluster=False)
    stack.start_operator()


def start_real_stack() -> Stack:
    """Part 1's cluster: a real node shaped as an MI300X server, as `make demo`'s; torn down on failure."""
    stack = Stack(ControlPlane(workdir=new_workdir("pd-bench-"), bin_dir=binaries_dir("--node")))
    try:
        stack.start_real_control_plane()
        stack.start_real_node(shape=MI300X_SERVER)
        start_operator(stack)
    except BaseException:
        stack.down()
        raise
    return stack


def start_kwok_stack(namespace: str, pods: int) -> tuple[Stack, list[str]]:
    """Part 2's cluster: the API server auditing the operator's requests, and enough KWOK nodes for `pods`
    serving pods; torn down on failure."""
    cp = ControlPlane(workdir=new_workdir("pd-bench-"), bin_dir=binaries_dir("--kwok"))
    cp.audit_groups = [f"system:serviceaccounts:{OPERATOR_NAMESPACE}"]
    stack = Stack(cp)
    try:
        cp.start()
        ref, nodes = kwok.start(cp, kwok_config.nodes_needed(pods, serving_pod_requests(namespace), MI300X_SERVER))
        for node in nodes:
            stack.wait_node_ready(node, ref)
        start_operator(stack)
    except BaseException:
        stack.down()
        raise
    return stack, nodes


def measure_latency(samples: int) -> dict[str, list[float]]:
    stack = start_real_stack()
    cp, namespace = stack.cp, "bench-latency"
    try:
        cp.kubectl("create", "namespace", namespace)
        created, ready = [], []
        for i in range(samples):
            name = f"lat-{i}"
            start = time.monotonic()
            cp.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(bench_pdd(name)))
            _until(lambda n=name: n in _pod_owners(cp, namespace), 60, "pod")
            created.append(time.monotonic() - start)
            _until(lambda n=name: n in _ready_names(cp, namespace), 120, "Ready")
            ready.append(time.monotonic() - start)
            cp.kubectl("delete", "pdd", name, "-n", namespace, "--wait=true", "--timeout=60s")
            _until(lambda n=name: n not in _pod_owners(cp, namespace), 60, "pod gone", 0.2)
        return {"created": created, "ready": ready}
    finally:
        stack.down()


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _audit_events(log: Path, since: datetime, until: datetime) -> list[tuple[float, str, str]]:
    """(seconds into the window, "verb resource[/subresource]", object name) of each request, once."""
    found: list[tuple[float, str, str]] = []
    seen: set[str] = set()
    for line in log.read_text().splitlines():
        event = json.loads(line)
        stamp = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if not since <= stamp < until or event["auditID"] in seen:
            continue
        seen.add(event["auditID"])
        ref = event.get("objectRef", {})
        resource = ref.get("resource", event.get("requestURI", "?"))
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        found.append(((stamp - since).total_seconds(), f"{event['verb']} {resource}", ref.get("name", "")))
    return found


def _last_status_patch(log: Path) -> datetime | None:
    last = None
    for line in log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef", {})
        if event["verb"] == "patch" and ref.get("resource") == "pddeployments" and ref.get("subresource") == "status":
            last = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
    return last


def _quiet(cp: ControlPlane, quiet_s: float, timeout_s: float) -> float:
    """Wait until no status patch came for ``quiet_s`` (every deployment reached its final state)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        last = _last_status_patch(cp.audit_log)
        if last is None or (datetime.now(UTC) - last).total_seconds() >= quiet_s:
            return time.monotonic() - start
        time.sleep(2)
    raise TimeoutError(f"status patches still coming after {timeout_s:.0f}s")


def measure_scale(count: int, steady_s: float) -> dict[str, Any]:
    namespace = "bench-scale"
    stack, nodes = start_kwok_stack(namespace, count)
    cp = stack.cp
    try:
        operator = next(p for p in cp.procs if p.name == "operator")
        cp.kubectl("create", "namespace", namespace)
        time.sleep(3)
        idle_rss = _rss_kib(operator.pid, "VmRSS")
        manifest = "\n---\n".join(json.dumps(bench_pdd(f"pdd-{i:03d}")) for i in range(count))
        start = time.monotonic()
        cp.kubectl("apply", "-n", namespace, "-f", "-", input_text=manifest)
        applied = time.monotonic() - start
        _until(lambda: len(_pod_owners(cp, namespace)) >= count, 600, "all pods", 0.2)
        all_pods = time.monotonic() - start
        _until(lambda: len(_ready_names(cp, namespace)) >= count, 600, "all Ready", 0.2)
        all_ready = time.monotonic() - start
        settled = _quiet(cp, QUIET_S, 600)  # unchanged from here on: the last status patch is QUIET_S old
        window_start = datetime.now(UTC)
        time.sleep(steady_s)
        window_end = datetime.now(UTC)
        requests = _audit_events(cp.audit_log, window_start, window_end)
        counts = collections.Counter(what for _, what, _ in requests)
        per_pdd_min = sum(counts.values()) / count / (steady_s / 60)
        patched = [(round(t), name) for t, what, name in requests if what == "patch pddeployments/status"]
        status_patches = len(patched)
        if patched:  # what an unchanged deployment should never do: say when and which, to find out why
            logging.getLogger(__name__).warning("status patches in the window (s, name): %s", patched)
        return {
            "pdds": count,
            "nodes": len(nodes),
            "apply_s": applied,
            "all_pods_s": all_pods,
            "all_ready_s": all_ready,
            "settled_s": settled,
            "idle_rss_mib": idle_rss / 1024,
            "peak_rss_mib": _rss_kib(operator.pid, "VmHWM") / 1024,
            "steady_window_s": steady_s,
            "requests_per_pdd_per_min": per_pdd_min,
            "status_patches": status_patches,
            "requests_in_window": sum(counts.values()),
            "top_requests": counts.most_common(6),
        }
    finally:
        stack.down()


def render(latency: dict[str, list[float]], scale: dict[str, Any], argv: list[str]) -> str:
    load = os.getloadavg()[0]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lat_rows = "\n".join(
        f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        for label, values in (
            ("apply -> serving pod created", latency["created"]),
            ("apply -> PDDeployment Ready", latency["ready"]),
        )
    )
    top = ", ".join(f"{name}: {n}" for name, n in scale["top_requests"])
    window, per_min = f"{scale['steady_window_s']:.0f} s window, audit log", scale["requests_per_pdd_per_min"]
    n = scale["nodes"]
    nodes = (
        "1 KWOK v0.8.0 node shaped as an MI300X server" if n == 1 else f"{n} KWOK v0.8.0 nodes shaped as MI300X servers"
    )
    return f"""{BEGIN}
Generated by `{COMMAND}`{" " + " ".join(argv) if argv else ""}. Control plane: Kubernetes v1.36.3 built from
source (e2e/build-control-plane.sh); the operator run as a local process with the chart's ServiceAccount.
Measured on: {platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f} at the end, {when}.

**Latency** (one real node: kubelet v1.36.3, containerd and runc, shaped as an MI300X server; engines and
proxy run in the pod's containers; `instant` simulation profile; {len(latency["ready"])} samples one after another):

| interval | median s | min s | max s |
|---|---|---|---|
{lat_rows}

**Scale** ({nodes}: pods become Running/Ready through the API, without processes;
{scale["pdds"]} PDDeployments applied with one `kubectl apply`):

| measure | value |
|---|---|
| `kubectl apply` of all objects | {scale["apply_s"]:.1f} s |
| apply -> every PDDeployment has its pod | {scale["all_pods_s"]:.1f} s |
| apply -> every PDDeployment Ready | {scale["all_ready_s"]:.1f} s |
| Ready -> no status patch for {QUIET_S:.0f} s (the window opens) | {scale["settled_s"]:.1f} s |
| operator RSS idle / peak (VmHWM) | {scale["idle_rss_mib"]:.0f} MiB / {scale["peak_rss_mib"]:.0f} MiB |
| API requests per PDDeployment per minute, steady state ({window}) | {per_min:.3f} |
| all operator requests / status patches in that window | {scale["requests_in_window"]} / {scale["status_patches"]} |

Most frequent operator requests in the window: {top}.
{END}"""


def update_docs(section: str) -> None:
    text = DOCS.read_text()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Operator\n\n" + section + "\n"
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdds", type=int, default=100)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument(
        "--steady-seconds", type=float, default=660.0, help="steady-state window; >= 600 includes a drift repair"
    )
    parser.add_argument("--update-docs", action="store_true", help=f"write the results into {DOCS.name}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    latency = measure_latency(args.samples)
    scale = measure_scale(args.pdds, args.steady_seconds)
    extra = [a for a in (argv or sys.argv[1:]) if a != "--update-docs"]
    section = render(latency, scale, extra)
    logging.getLogger(__name__).warning("scale result: %s", json.dumps(scale))
    sys.stdout.write(section + "\n")
    if args.update_docs:
        update_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
