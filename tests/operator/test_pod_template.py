"""spec.podTemplate: what it adds to the serving pod, and what it refuses (fields we own or model elsewhere)."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator import layout, render
from pd_operator.validation import SpecError, validate_spec

NETWORKS = "k8s.v1.cni.cncf.io/networks"
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "serving"}, "annotations": {NETWORKS: "rdma-net"}},
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "serving",
    "runtimeClassName": "rocm",
    "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}],
    "volumeMounts": {
        "prefill": [{"name": "datasets", "mountPath": "/data", "readOnly": True}],
        "proxy": [{"name": "datasets", "mountPath": "/data", "subPath": "prompts"}],
    },
}


def rendered(template: dict[str, Any], **spec: Any) -> render.Children:
    full = {"model": "m", "engine": "simulated", "goodputProbe": {"enabled": True}, "podTemplate": template, **spec}
    return render.children(layout.build(layout.Owner("qwen", "ns", "uid-1"), validate_spec(full)))


def test_the_template_lands_on_the_serving_pod_beside_what_the_operator_owns() -> None:
    children = rendered(TEMPLATE)
    pod = children.pod
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["annotations"][NETWORKS] == "rdma-net" and render.ANNOTATION_SPEC_HASH in meta["annotations"]
    assert meta["labels"]["team"] == "serving" and meta["labels"][render.LABEL_DEPLOYMENT] == "qwen"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert (spec["serviceAccountName"], spec["runtimeClassName"]) == ("serving", "rocm")
    assert spec["automountServiceAccountToken"] is False
    assert {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}} in spec["volumes"]
    mounts = {c["name"]: c["volumeMounts"] for c in spec["containers"]}
    assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in mounts["prefill"]
    assert not any(m["name"] == "datasets" for m in mounts["decode"])
    assert {"name": "datasets", "mountPath": "/data", "readOnly": False, "subPath": "prompts"} in mounts["proxy"]
    job_spec = render.probe_job(
        layout.build(
            layout.Owner("qwen"), validate_spec({"model": "m", "engine": "simulated", "podTemplate": TEMPLATE})
        ),
        "j",
    )
    assert job_spec["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry"}]


def test_an_annotation_change_rolls_the_pod_and_no_template_keeps_the_old_hash() -> None:
    plain = rendered({}).pod
    annotated = rendered({"metadata": {"annotations": {NETWORKS: "a"}}}).pod
    other = rendered({"metadata": {"annotations": {NETWORKS: "b"}}}).pod
    hashes = [p["metadata"]["annotations"][render.ANNOTATION_SPEC_HASH] for p in (plain, annotated, other)]
    assert len(set(hashes)) == 3
    assert hashes[0] == render.spec_hash(plain["spec"])


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}, "spec.podTemplate.metadata.labels: "),
        ({"metadata": {"labels": {"pd.serving.dev/deployment": "x"}}}, "spec.podTemplate.metadata.labels: "),
        ({"metadata": {"annotations": {"pd.serving.dev/spec-hash": "x"}}}, "spec.podTemplate.metadata.annotations: "),
        (
            {"nodeSelector": {"a": "b"}},
            "spec.podTemplate.nodeSelector: podTemplate.nodeSelector is refused: use spec.node.nodeSelector",
        ),
        (
            {"hostNetwork": True},
            "spec.podTemplate.hostNetwork: podTemplate.hostNetwork is refused: use spec.kvTransfer.rdma.hostNetwork",
        ),
        ({"securityContext": {}}, "spec.podTemplate.securityContext: podTemplate.securityContext is refused"),
        ({"containers": []}, "spec.podTemplate.containers: podTemplate.containers is refused"),
        ({"volumes": [{"name": "dshm-prefill", "emptyDir": {}}]}, "spec.podTemplate.volumes: "),
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "spec.podTemplate.volumes: "),
        ({"volumeMounts": {"decode": [{"name": "nowhere", "mountPath": "/x"}]}}, "spec.podTemplate.volumeMounts: "),
        (
            {
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": {"engine": [{"name": "a", "mountPath": "/dev/shm"}]},
            },
            "spec.podTemplate.volumeMounts: ",
        ),
    ],
)
def test_fields_we_own_or_model_elsewhere_are_refused(template: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({"model": "m", "podTemplate": template})
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems
