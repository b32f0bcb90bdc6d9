"""spec.podTemplate on a real API server: what it adds reaches the serving pod (and its pull secrets the
probe Job, which runs the operator's small image), `kubectl explain` says what it refuses and where those
fields live instead."""

from __future__ import annotations

import json

import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import OPERATOR_NAMESPACE, Stack
from e2e.tests.kube import Obj, apply, get, pod, wait_for, wait_pdd_ready

NETWORKS = "k8s.v1.cni.cncf.io/networks"


def test_template_metadata_account_and_volumes_land_on_the_serving_pod(
    operator: Stack, cp: ControlPlane, namespace: str
) -> None:
    """A Multus-style network annotation, a label, a ServiceAccount, a RuntimeClass and a mounted volume."""
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "e2e-rocm"}}
    apply(cp, json.dumps({**runtime_class, "handler": "runc"}), namespace)
    cp.kubectl("create", "serviceaccount", "serving", "-n", namespace)
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / "simulated-colocated.yaml").read_text())
    obj["spec"]["goodputProbe"] = {"enabled": True, "requests": 4, "promptTokens": 20, "outputTokens": 4}
    obj["spec"]["podTemplate"] = {
        "metadata": {"labels": {"team": "serving"}, "annotations": {NETWORKS: "default/rdma-net"}},
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccountName": "serving",
        "runtimeClassName": "e2e-rocm",
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "16Mi"}}],
        "volumeMounts": {"proxy": [{"name": "scratch", "mountPath": "/scratch"}]},
    }
    apply(cp, json.dumps(obj), namespace)
    try:
        # The goodput probe starts once Ready and runs the operator's small image, with the pull secrets.
        job = wait_for(
            lambda: (get(cp, f"/apis/batch/v1/namespaces/{namespace}/jobs") or {}).get("items"), 150, "a probe Job"
        )[0]
        job_pod = job["spec"]["template"]["spec"]
        assert job_pod["containers"][0]["image"] == operator_image(cp)
        assert job_pod["imagePullSecrets"] == [{"name": "registry"}]
        status = wait_pdd_ready(cp, namespace, obj["metadata"]["name"], timeout_s=120)["status"]
        serving = pod(cp, namespace, status["podName"])
        assert serving is not None
        meta, spec = serving["metadata"], serving["spec"]
        assert meta["annotations"][NETWORKS] == "default/rdma-net"
        assert meta["labels"]["team"] == "serving" and meta["labels"]["pd.serving.dev/deployment"] == "sim-colocated"
        assert (spec["serviceAccountName"], spec["runtimeClassName"]) == ("serving", "e2e-rocm")
        proxy = next(c for c in spec["containers"] if c["name"] == "proxy")
        assert {"name": "scratch", "mountPath": "/scratch"} in proxy["volumeMounts"]
        ready = {c["name"]: c["ready"] for c in serving["status"]["containerStatuses"]}
        assert all(ready.values()), ready
    finally:
        cp.kubectl("delete", "runtimeclass", "e2e-rocm", "--wait=false", check=False)


def operator_image(cp: ControlPlane) -> str:
    """The image of the chart's operator Deployment."""
    listing = get(cp, f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments") or {}
    return str(listing["items"][0]["spec"]["template"]["spec"]["containers"][0]["image"])


def test_kubectl_explain_says_which_fields_are_refused_and_where_they_live(operator: Stack, cp: ControlPlane) -> None:
    explained = cp.kubectl("explain", "pdd.spec.podTemplate")
    assert "fields it does model are refused here" in " ".join(explained.split())
    node_selector = " ".join(cp.kubectl("explain", "pdd.spec.podTemplate.nodeSelector").split())
    assert "Refused: use spec.node.nodeSelector." in node_selector
