"""The mission end to end: `kubectl apply` a PDDeployment, the operator (chart RBAC) makes it serve.

The real cluster serves the whole module (a kubelet node shaped as an MI300X server, the operator
in-cluster from its image). The three simulated examples are applied at once and checked per mode; a
separate deployment goes through the lifecycle tests (spec change, pod deletion, killed engine, garbage
collection) in file order, each leaving it Ready for the next.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import OPERATOR_NAMESPACE, Stack
from e2e.tests.kube import (
    GROUP_PATH,
    Obj,
    apply,
    condition,
    create_namespace,
    get,
    kill_container,
    pdd,
    phase,
    pod,
    pods,
    stream_completion,
    wait_for,
    wait_pdd_ready,
)

EXAMPLES = {
    "write": REPO_ROOT / "examples" / "simulated-write.yaml",
    "read": REPO_ROOT / "examples" / "simulated-read.yaml",
    "colocated": REPO_ROOT / "examples" / "simulated-colocated.yaml",
}
ROLE_CONDITIONS = {
    "write": ["SpecValid", "PrefillReady", "DecodeReady", "ProxyReady", "Ready"],
    "read": ["SpecValid", "PrefillReady", "DecodeReady", "ProxyReady", "Ready"],
    "colocated": ["SpecValid", "EngineReady", "ProxyReady", "Ready"],
}


def load_example(mode: str, name: str | None = None) -> Obj:
    obj: Obj = yaml.safe_load(EXAMPLES[mode].read_text())
    if name:
        obj["metadata"]["name"] = name
    return obj


def apply_obj(cp: ControlPlane, obj: Obj, namespace: str) -> None:
    apply(cp, json.dumps(obj), namespace)


def serving_pod(cp: ControlPlane, namespace: str, name: str) -> Obj:
    obj = pdd(cp, namespace, name)
    assert obj is not None
    found = pod(cp, namespace, obj["status"]["podName"])
    assert found is not None
    return found


def children(cp: ControlPlane, namespace: str, name: str) -> dict[str, list[str]]:
    """Every object the operator created for `name`, by kind (label pd.serving.dev/deployment)."""
    selector = f"pd.serving.dev/deployment={name}"
    kinds = {
        "pods": "/api/v1",
        "services": "/api/v1",
        "configmaps": "/api/v1",
        "networkpolicies": "/apis/networking.k8s.io/v1",
        "jobs": "/apis/batch/v1",
    }
    found: dict[str, list[str]] = {}
    for kind, prefix in kinds.items():
        listing = get(cp, f"{prefix}/namespaces/{namespace}/{kind}?labelSelector={selector}") or {}
        found[kind] = sorted(item["metadata"]["name"] for item in listing.get("items", []))
    return found


# ---- the three modes ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modes_namespace(operator: Stack) -> Iterator[str]:
    """All three simulated examples applied at once, so they come up in parallel."""
    cp = operator.cp
    namespace = "pd-modes"
    create_namespace(cp, namespace)
    for mode in EXAMPLES:
        apply_obj(cp, load_example(mode), namespace)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_example_becomes_ready_and_serves(cp: ControlPlane, modes_namespace: str, mode: str) -> None:
    name = load_example(mode)["metadata"]["name"]
    obj = wait_pdd_ready(cp, modes_namespace, name, timeout_s=180)
    for kind in ROLE_CONDITIONS[mode]:
        assert (condition(obj, kind) or {}).get("status") == "True", (kind, obj["status"])
    serving = serving_pod(cp, modes_namespace, name)
    assert serving["spec"]["nodeName"] == "mi300x-0"
    assert serving["status"]["qosClass"] == "Burstable", "CPU and memory requests: never BestEffort"
    assert (condition(obj, "ChildrenAdmitted") or {}).get("status") == "True", obj["status"]
    statuses = serving["status"]["containerStatuses"]
    assert statuses and all(s["ready"] and "running" in s["state"] for s in statuses)
    assert stream_completion(serving["status"]["podIP"])
    if mode != "colocated":
        verified = wait_for(
            lambda: (condition(pdd(cp, modes_namespace, name), "KVTransferVerified") or {}).get("status") == "True",
            60,
            "KVTransferVerified after a request",
        )
        assert verified


HOSTILE_REQUESTS = {
    "a negative chunk size": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n-6\r\n0\r\n\r\n"
    ),
    "a bare LF hiding a Content-Length": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: a\nContent-Length: 36\r\n\r\n"
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    ),
}


def test_a_hostile_request_does_not_stop_the_pods_proxy(cp: ControlPlane, modes_namespace: str) -> None:
    """Issue 19, against the rendered pod: each request is refused with 400, and the proxy goes on serving."""
    name = load_example("write")["metadata"]["name"]
    wait_pdd_ready(cp, modes_namespace, name, timeout_s=180)
    pod_ip = serving_pod(cp, modes_namespace, name)["status"]["podIP"]
    for what, request in HOSTILE_REQUESTS.items():
        with socket.create_connection((pod_ip, 8000), timeout=10) as sock:
            sock.sendall(request)
            answer = b""
            while piece := sock.recv(65536):  # the proxy answers, then closes
                answer += piece
        assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"Content-Length: ") == 1, (what, answer)
    health = httpx.get(f"http://{pod_ip}:8000/health", timeout=5, trust_env=False)
    assert health.status_code == 200
    assert stream_completion(pod_ip)


@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_goodput_probe_writes_status(cp: ControlPlane, modes_namespace: str, mode: str) -> None:
    """The probe Job reaches the proxy by its Service name from its own pod, and the result lands in status."""
    name = load_example(mode)["metadata"]["name"]
    wait_pdd_ready(cp, modes_namespace, name, timeout_s=180)

    def goodput() -> Obj | None:
        status = (pdd(cp, modes_namespace, name) or {}).get("status") or {}
        return status.get("goodput")

    result = wait_for(goodput, 180, f"status.goodput of {name}")
    assert result["requests"] > 0 and 0.0 <= result["attainment"] <= 1.0
    met = condition(pdd(cp, modes_namespace, name), "GoodputMet") or {}
    assert met.get("status") in ("True", "False"), met


def test_printer_columns(cp: ControlPlane, modes_namespace: str) -> None:
    wait_pdd_ready(cp, modes_namespace, load_example("write")["metadata"]["name"], timeout_s=180)
    header, *rows = cp.kubectl("get", "pdd", "-n", modes_namespace).splitlines()
    for column in ("NAME", "MODE", "TRANSFER", "READY", "PHASE", "PREFILL GPUS", "DECODE GPUS", "GOODPUT", "AGE"):
        assert column in header, header
    write_row = next(r for r in rows if r.startswith(load_example("write")["metadata"]["name"]))
    assert "disaggregated" in write_row and "write" in write_row and "Ready" in write_row


# ---- admission ------------------------------------------------------------------------------------------


def _operator_test_table(name: str) -> Any:
    """A table module the unit suite shares with this one (tests/operator/<name>.py)."""
    path = REPO_ROOT / "tests" / "operator" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"pd_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC_TABLE = _operator_test_table("spec_table")
FLAG_SPELLINGS = _operator_test_table("flag_spellings")


def _dry_run_create(operator: Stack, name: str, spec: dict[str, Any]) -> Any:
    body = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": name}, "spec": spec}
    with operator.cp.http() as client:
        return client.post(f"{GROUP_PATH}/namespaces/default/pddeployments?dryRun=All", json=body)


@pytest.mark.parametrize("case", SPEC_TABLE.load_cases(), ids=lambda c: c["name"])
def test_invalid_spec_rejected_by_api_server(operator: Stack, case: dict[str, Any]) -> None:
    resp = _dry_run_create(operator, SPEC_TABLE.name_of(case), SPEC_TABLE.patched(case))
    assert resp.status_code == 422, f"{case['name']}: accepted ({resp.status_code})"
    status = resp.json()
    causes = status.get("details", {}).get("causes", [])
    lines = [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes] or [status["message"]]
    assert any(line.startswith(case["field"]) and case["message"] in line for line in lines), (
        f"{case['name']}: no error on {case['field']} containing {case['message']!r} in {lines}"
    )


def _dry_run_with_prefill_args(operator: Stack, words: tuple[str, ...]) -> Any:
    spec = {**SPEC_TABLE.load_table()["base"], "prefill": {"extraArgs": list(words)}}
    return _dry_run_create(operator, "flags", spec)


@pytest.mark.parametrize("words", list(FLAG_SPELLINGS.REFUSED), ids=" ".join)
def test_api_server_refuses_a_managed_flag_in_each_spelling_vllm_reads(operator: Stack, words: tuple[str, ...]) -> None:
    resp = _dry_run_with_prefill_args(operator, words)
    assert resp.status_code == 422 and "is managed by the operator" in resp.text, resp.text


@pytest.mark.parametrize("words", FLAG_SPELLINGS.ACCEPTED, ids=" ".join)
def test_api_server_takes_extra_args_of_other_flags(operator: Stack, words: tuple[str, ...]) -> None:
    resp = _dry_run_with_prefill_args(operator, words)
    assert resp.status_code == 201, resp.text


# ---- lifecycle of one deployment ----------------------------------------------------------------------------

LIFECYCLE = "lifecycle"


@pytest.fixture(scope="module")
def lifecycle(operator: Stack) -> Iterator[str]:
    cp = operator.cp
    namespace = "pd-lifecycle"
    create_namespace(cp, namespace)
    obj = load_example("write", LIFECYCLE)
    obj["spec"]["goodputProbe"] = {"enabled": False}
    apply_obj(cp, obj, namespace)
    wait_pdd_ready(cp, namespace, LIFECYCLE, timeout_s=180)
    yield namespace
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_spec_change_rolls_the_pod(cp: ControlPlane, lifecycle: str) -> None:
    before = serving_pod(cp, lifecycle, LIFECYCLE)
    generation = pdd(cp, lifecycle, LIFECYCLE)["metadata"]["generation"]  # type: ignore[index]
    patch = json.dumps({"spec": {"decode": {"maxNumSeqs": 32}}})
    cp.kubectl("patch", "pdd", LIFECYCLE, "-n", lifecycle, "--type=merge", "-p", patch)
    obj = wait_pdd_ready(cp, lifecycle, LIFECYCLE, timeout_s=180)
    assert obj["status"]["observedGeneration"] == generation + 1
    after = serving_pod(cp, lifecycle, LIFECYCLE)
    assert after["metadata"]["uid"] != before["metadata"]["uid"], "the pod was rolled"
    decode = next(c for c in after["spec"]["containers"] if c["name"] == "decode")
    argv = [a.replace("_", "-") if a.startswith("--") else a for a in decode["command"] + decode.get("args", [])]
    assert "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "32"  # vLLM takes both spellings


def test_deleted_pod_comes_back(cp: ControlPlane, lifecycle: str) -> None:
    before = serving_pod(cp, lifecycle, LIFECYCLE)
    cp.kubectl("delete", "pod", before["metadata"]["name"], "-n", lifecycle, "--wait=false")

    def replaced() -> bool:
        current = pods(cp, lifecycle, f"pd.serving.dev/deployment={LIFECYCLE}")
        return any(p["metadata"]["uid"] != before["metadata"]["uid"] for p in current)

    wait_for(replaced, 60, "a new serving pod")

    def ready_on_the_new_pod() -> bool:
        # the Ready of the deleted pod stays in the status until the operator's next tick: wait for the new one's
        obj = pdd(cp, lifecycle, LIFECYCLE)
        return phase(obj) == "Ready" and (obj or {})["status"].get("podUid") not in (None, before["metadata"]["uid"])

    wait_for(ready_on_the_new_pod, 180, "PDDeployment Ready on the new serving pod")
    assert serving_pod(cp, lifecycle, LIFECYCLE)["metadata"]["uid"] != before["metadata"]["uid"]


def test_killed_decode_degrades_then_recovers(cp: ControlPlane, lifecycle: str) -> None:
    serving = serving_pod(cp, lifecycle, LIFECYCLE)
    meta = serving["metadata"]
    kill_container(cp, serving, "decode")  # the decode engine crashes
    wait_for(lambda: phase(pdd(cp, lifecycle, LIFECYCLE)) == "Degraded", 60, "phase Degraded", interval_s=0.1)
    obj = wait_pdd_ready(cp, lifecycle, LIFECYCLE, timeout_s=180)
    decode = next(r for r in obj["status"]["roles"] if r["name"] == "decode")
    assert decode["restartCount"] >= 1
    assert serving_pod(cp, lifecycle, LIFECYCLE)["metadata"]["uid"] == meta["uid"], "restarted in place"


def test_deleting_the_deployment_removes_every_child(cp: ControlPlane, lifecycle: str) -> None:
    assert children(cp, lifecycle, LIFECYCLE)["pods"], "precondition: the deployment has children"
    cp.kubectl("delete", "pdd", LIFECYCLE, "-n", lifecycle, "--wait=false")

    def all_gone() -> bool:
        return pdd(cp, lifecycle, LIFECYCLE) is None and not any(children(cp, lifecycle, LIFECYCLE).values())

    wait_for(all_gone, 90, "garbage collection of every child")


# ---- operator restart ----------------------------------------------------------------------------------------


def test_operator_restart_mid_reconcile_converges_without_duplicates(
    operator: Stack, cp: ControlPlane, namespace: str
) -> None:
    apply_obj(cp, load_example("write", "restart"), namespace)
    wait_for(
        lambda: children(cp, namespace, "restart")["services"],
        30,
        "reconcile started (Service created)",
        interval_s=0.05,
    )
    operator.restart_operator()  # SIGTERM, as a rolling update of the operator Deployment does
    wait_pdd_ready(cp, namespace, "restart", timeout_s=180)
    found = children(cp, namespace, "restart")
    serving = pods(cp, namespace, "pd.serving.dev/deployment=restart,app.kubernetes.io/component=serving")
    assert len(serving) == 1, [p["metadata"]["name"] for p in serving]
    assert len(found["services"]) == 1 and len(found["networkpolicies"]) == 1, found
    assert len(found["jobs"]) <= 1, found


# ---- RBAC -----------------------------------------------------------------------------------------------------

# Contract 5 of the team brief: what the operator may do, and nothing more.
EXPECTED_RULES = {
    "pddeployments.pd.serving.dev": {"get", "list", "watch", "patch"},
    "pddeployments.pd.serving.dev/status": {"get", "patch", "update"},
    "pddeployments.pd.serving.dev/finalizers": {"update"},
    "pddeployments.pd.serving.dev/scale": {"get", "patch"},  # spec.autoscaling writes replicas there
    "horizontalpodautoscalers.autoscaling": {"list"},  # one owner of replicas: an HPA on the object wins
    "pods": {"get", "list", "watch", "create", "delete", "patch"},
    "services": {"get", "list", "watch", "create", "patch", "delete"},
    "configmaps": {"get", "create", "patch"},  # the proxy settings: read (who holds it), then applied
    "events": {"create", "patch"},
    "events.events.k8s.io": {"create", "patch"},
    "networkpolicies.networking.k8s.io": {"get", "list", "watch", "create", "patch", "delete"},
    "jobs.batch": {"get", "list", "watch", "create", "delete"},
    "poddisruptionbudgets.policy": {"get", "create", "patch", "delete"},
    # spec.router's children; EndpointSlices only so that it may grant them to the router's Role
    "deployments.apps": {"get", "create", "patch", "delete"},
    "serviceaccounts": {"get", "create", "patch", "delete"},
    "roles.rbac.authorization.k8s.io": {"get", "create", "patch", "delete"},
    "rolebindings.rbac.authorization.k8s.io": {"get", "create", "patch", "delete"},
    "endpointslices.discovery.k8s.io": {"get", "list", "watch"},
    "inferencepools.inference.networking.k8s.io": {"get", "create", "patch", "delete"},  # spec.inferencePool
    # cluster-wide install: peering through a ClusterKopfPeering only (namespaced KopfPeering rights
    # belong to the chart's watchNamespaces mode, where they replace this one)
    "clusterkopfpeerings.kopf.dev": {"get", "list", "watch", "patch"},
    "namespaces": {"list", "watch"},
    "nodes": {"list", "watch"},  # read-only: whether the serving pod's node is lost
    # each PDDeployment's credentials Secret: created once, read for its admin key; never listed or changed
    "secrets": {"get", "create"},
    "customresourcedefinitions.apiextensions.k8s.io": {"list", "watch"},
}
# granted to every authenticated user by the default bootstrap roles, not by the chart
SELF_REVIEWS = {
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
}


def test_operator_service_account_has_least_privilege(operator: Stack) -> None:
    account = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{operator.operator_service_account()}"
    out = operator.cp.kubectl("auth", "can-i", "--list", f"--as={account}", "-n", "default")
    granted: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if not parts or parts[0].startswith("[") or parts[0] in SELF_REVIEWS:
            continue  # non-resource URLs and self reviews
        resource, verbs = parts[0], line[line.rindex("[") + 1 : line.rindex("]")].split()
        if resource.endswith("[]"):
            resource = resource[:-2]
        granted.setdefault(resource, set()).update(verbs)
    assert granted == EXPECTED_RULES


def test_chart_installs_with_helm_v4(operator: Stack, cp: ControlPlane) -> None:
    """Helm v4 (server-side apply by default) installs the same chart as a second release."""
    release, namespace = "pd-operator-v4", "pd-helm4"
    operator.helm(
        "install",
        release,
        str(REPO_ROOT / "charts" / "pd-operator"),
        "-n",
        namespace,
        "--create-namespace",
        "--set",
        "replicaCount=0",
        # One tenancy admission policy per cluster: the suite's release has it; a second binding (cluster-wide,
        # and enforced for a while after an uninstall, as the API server reloads policies asynchronously)
        # would refuse the other tests' specs with the chart's defaults.
        "--set",
        "policy.admission=false",
        "--wait",
        "--timeout",
        "120s",
        version=4,
    )
    try:
        listing = get(cp, f"/apis/apps/v1/namespaces/{namespace}/deployments") or {}
        assert [d["metadata"]["name"] for d in listing["items"]], "the chart's Deployment exists"
    finally:
        operator.helm("uninstall", release, "-n", namespace, "--wait", version=4)
    assert get(cp, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pddeployments.pd.serving.dev")


def test_the_api_server_keeps_every_word_of_the_crd(operator: Stack, cp: ControlPlane) -> None:
    """The installed CRD's versions are the committed file's: a schema keyword apiextensions lacks is dropped
    without a word (and its constraint with it), which then fails Helm v4's server-side apply of the chart."""
    committed = yaml.safe_load((REPO_ROOT / "crds" / "pddeployment.yaml").read_text())
    live = get(cp, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pddeployments.pd.serving.dev")
    assert live is not None
    assert live["spec"]["versions"] == committed["spec"]["versions"]
