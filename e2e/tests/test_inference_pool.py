"""spec.inferencePool on the real API server, under the Gateway API Inference Extension's own CRD (from
its Go module at the version e2e/fetch-crds.sh pins).

In order, on one PDDeployment: without the CRD the InferencePool is refused, which shows as the
ChildrenAdmitted condition and a ChildRefused Event while the deployment serves; once the CRD is
installed the operator's InferencePool is admitted under the CRD's schema and CEL rules and selects the
serving pod on the proxy's API port; disabling deletes it. No gateway runs here (render-only): what is
checked is that a gateway's controller would find a valid pool whose members are the serving pods.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import (
    Obj,
    apply,
    children_admitted,
    create_namespace,
    get,
    pdd_events,
    pods,
    simulated_example,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

NAME = "pool"
CRD = "inferencepools.inference.networking.k8s.io"
CRD_FILE = "inference.networking.k8s.io_inferencepools.yaml"
PICKER = {"name": "pool-epp", "port": 9002}
PICKER_REF = {"name": "pool-epp", "port": {"number": 9002}}  # as the InferencePool names it
SERVING = f"pd.serving.dev/deployment={NAME},app.kubernetes.io/component=serving"


@pytest.fixture(scope="module")
def crd_file() -> Path:
    script = REPO_ROOT / "e2e" / "fetch-crds.sh"
    out = subprocess.run(["bash", str(script), "inference"], check=True, capture_output=True, text=True, timeout=600)
    return Path(out.stdout.strip().splitlines()[-1]) / CRD_FILE


@pytest.fixture(scope="module")
def ns(operator: Stack, cp: ControlPlane) -> Iterator[str]:
    cp.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait=true")  # a reused control plane may have it
    name = create_namespace(cp, "t-pool")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


def manifest(enabled: bool) -> str:
    obj = simulated_example(NAME)
    obj["spec"]["goodputProbe"]["enabled"] = False
    obj["spec"]["inferencePool"] = {"enabled": enabled, "endpointPicker": PICKER}
    return yaml.safe_dump(obj)


def pool_path(ns: str) -> str:
    return f"/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{NAME}"


def dry_run(cp: ControlPlane, obj: Obj) -> subprocess.CompletedProcess[str]:
    argv = [cp.tool("kubectl"), "apply", "--server-side", "--dry-run=server", "-f", "-"]
    return subprocess.run(argv, env=cp.env(), input=json.dumps(obj), capture_output=True, text=True, timeout=120)


def pod_ip(cp: ControlPlane, ns: str) -> str:
    (serving,) = pods(cp, ns, SERVING)
    return str(serving["status"]["podIP"])


def test_without_the_crd_the_pool_is_refused_visibly_and_serving_goes_on(cp: ControlPlane, ns: str) -> None:
    apply(cp, manifest(enabled=True), ns)
    wait_pdd_ready(cp, ns, NAME, timeout_s=300)
    assert stream_completion(pod_ip(cp, ns)), "the deployment serves while its InferencePool is refused"
    refused = wait_for(lambda: children_admitted(cp, ns, NAME, "False"), 120, "ChildrenAdmitted False")
    assert refused["reason"] == "NotServed", refused
    expected = f"InferencePool/{NAME} refused by the API server: no InferencePool API is served: install its CRD"
    assert refused["message"] == expected, refused
    [event] = wait_for(lambda: pdd_events(cp, ns, NAME, "ChildRefused"), 60, "a ChildRefused Event")
    assert event["type"] == "Warning" and event["message"] == expected


def test_with_the_crd_the_pool_is_admitted_and_selects_the_serving_pod(
    cp: ControlPlane, ns: str, crd_file: Path
) -> None:
    cp.kubectl("apply", "--server-side", "-f", str(crd_file))
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    pool = wait_for(lambda: get(cp, pool_path(ns)), 180, "the InferencePool")
    owner = get(cp, f"/apis/pd.serving.dev/v1alpha1/namespaces/{ns}/pddeployments/{NAME}") or {}
    refs = [(r["kind"], r["uid"]) for r in pool["metadata"]["ownerReferences"]]
    assert refs == [("PDDeployment", owner["metadata"]["uid"])]
    spec = pool["spec"]
    assert spec["targetPorts"] == [{"number": 8000}]
    assert spec["endpointPickerRef"] == {"group": "", "kind": "Service", **PICKER_REF, "failureMode": "FailClose"}
    members = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
    (member,) = pods(cp, ns, members)  # the selector picks exactly the serving pod (not the probe, not others)
    assert member["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    wait_for(lambda: children_admitted(cp, ns, NAME, "True"), 120, "ChildrenAdmitted True")
    # the CRD's own rules hold the rendered object to its schema: a second target port is refused
    broken = copy.deepcopy(pool)
    broken["spec"]["targetPorts"].append({"number": 8001})
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        broken["metadata"].pop(key, None)
    result = dry_run(cp, broken)
    assert result.returncode != 0 and "targetPorts" in result.stderr, result.stdout + result.stderr


def test_disabling_deletes_the_pool(cp: ControlPlane, ns: str) -> None:
    apply(cp, manifest(enabled=False), ns)
    wait_for(lambda: get(cp, pool_path(ns)) is None or None, 180, "the InferencePool deleted")
