"""The tenancy policy: every rule refuses its escalation under the default policy and admits it once widened;
the operator refuses to reconcile a refused spec; `pdctl render` applies the default policy or a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator import decide, policy
from pd_operator.actions import Emit
from pd_operator.commands import policy_file
from pd_operator.commands import render as render_command
from pd_operator.policy import DEFAULT_POLICY, RULES, HostPathPrefix, TenancyPolicy, violations
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError, validate_spec
from tests.operator.conftest import EXAMPLES, HOST_NETWORK_EXAMPLES
from tests.operator.test_decide import T0

BASE: dict[str, Any] = {"model": "m", "engine": "simulated"}
NS = "team-a"  # the PDDeployment's namespace
WRITABLE_MODELS = HostPathPrefix(path_prefix="/models", read_only=False)
NETWORKS = policy.NETWORKS_ANNOTATION
APPARMOR = "container.apparmor.security.beta.kubernetes.io/engine-0"


def annotated(key: str, value: str) -> dict[str, Any]:
    return {"podTemplate": {"metadata": {"annotations": {key: value}}}}


def annotation_field(key: str) -> str:
    return f'spec.podTemplate.metadata.annotations["{key}"]'


# rule -> (the escalation, the opt-in that admits it, the field named); one case per rule and place.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "image": ("ImageNotAllowed", {"image": "evil.io/root:1"}, {"images": ["evil.io/"]}, "spec.image"),
    "image of a look-alike repository": (
        "ImageNotAllowed",
        {"image": "ghcr.io/pd-serving/pd-runtime-evil:1"},
        {"images": ["ghcr.io/pd-serving/"]},
        "spec.image",
    ),
    "model hostPath /": (
        "HostPathNotAllowed",
        {"modelStorage": {"hostPath": "/", "readOnly": True}},
        {"hostPaths": [{"pathPrefix": "/"}]},
        "spec.modelStorage.hostPath",
    ),
    "model hostPath writable": (
        "HostPathNotReadOnly",
        {"modelStorage": {"hostPath": "/models/hf"}},
        {"hostPaths": [{"pathPrefix": "/models", "readOnly": False}]},
        "spec.modelStorage.hostPath",
    ),
    "cache hostPath": (
        "HostPathNotAllowed",
        {"cacheStorage": {"hostPath": "/var/lib/kubelet"}},
        {"hostPaths": [{"pathPrefix": "/var/lib/kubelet", "readOnly": False}]},
        "spec.cacheStorage.hostPath",
    ),
    "cache hostPath under a read-only prefix": (
        "HostPathNotReadOnly",
        {"cacheStorage": {"hostPath": "/cache/pd"}},
        {"hostPaths": [{"pathPrefix": "/cache", "readOnly": False}]},
        "spec.cacheStorage.hostPath",
    ),
    "hostPath volume /etc/kubernetes/pki": (
        "HostPathNotAllowed",
        {"podTemplate": {"volumes": [{"name": "pki", "hostPath": {"path": "/etc/kubernetes/pki"}}]}},
        {"hostPaths": [{"pathPrefix": "/etc/kubernetes"}]},
        "spec.podTemplate.volumes[0].hostPath.path",
    ),
    "hostPath volume mounted writable": (
        "HostPathNotReadOnly",
        {
            "podTemplate": {
                "volumes": [{"name": "data", "hostPath": {"path": "/data/x"}}],
                "volumeMounts": {"proxy": [{"name": "data", "mountPath": "/data"}]},
            }
        },
        {"hostPaths": [{"pathPrefix": "/data", "readOnly": False}]},
        "spec.podTemplate.volumes[0].hostPath.path",
    ),
    "nfs volume": (
        "VolumeTypeNotAllowed",
        {"podTemplate": {"volumes": [{"name": "n", "nfs": {"server": "nfs", "path": "/"}}]}},
        {"volumeTypes": ["nfs"]},
        "spec.podTemplate.volumes[0]",
    ),
    "projected ServiceAccount token": (
        "ServiceAccountTokenNotAllowed",
        {
            "podTemplate": {
                "volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]
            }
        },
        {"allowServiceAccountTokens": True},
        "spec.podTemplate.volumes[0].projected.sources[0].serviceAccountToken",
    ),
    "serviceAccountName": (
        "ServiceAccountNotAllowed",
        {"podTemplate": {"serviceAccountName": "cluster-admin-sa"}},
        {"serviceAccountNames": ["cluster-admin-sa"]},
        "spec.podTemplate.serviceAccountName",
    ),
    "toleration of every taint with a control-plane selector": (
        "TolerationNotAllowed",
        {
            "node": {
                "tolerations": [{"operator": "Exists"}],
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            }
        },
        {"tolerationKeys": [""]},
        "spec.node.tolerations[0].key",
    ),
    "control-plane toleration": (
        "TolerationNotAllowed",
        {"node": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
        {"tolerationKeys": ["node-role.kubernetes.io/control-plane"]},
        "spec.node.tolerations[0].key",
    ),
    "system-cluster-critical": (
        "PriorityClassNotAllowed",
        {"node": {"priorityClassName": "system-cluster-critical"}},
        {"priorityClassNames": ["system-cluster-critical"]},
        "spec.node.priorityClassName",
    ),
    "hostDevices": (
        "PrivilegedNotAllowed",
        {"engine": "vllm", "gpuAllocation": {"strategy": "hostDevices"}},
        {"allowPrivileged": True},
        "spec.gpuAllocation.strategy",
    ),
    "hostNetwork": (
        "HostNetworkNotAllowed",
        {"kvTransfer": {"rdma": {"hostNetwork": True}}},
        {"allowHostNetwork": True},
        "spec.kvTransfer.rdma.hostNetwork",
    ),
    "LoadBalancer": (
        "ServiceTypeNotAllowed",
        {"proxy": {"serviceType": "LoadBalancer"}},
        {"serviceTypes": ["ClusterIP", "LoadBalancer"]},
        "spec.proxy.serviceType",
    ),
    "runtimeClassName": (
        "RuntimeClassNotAllowed",
        {"podTemplate": {"runtimeClassName": "nvidia-privileged"}},
        {"runtimeClassNames": ["nvidia-privileged"]},
        "spec.podTemplate.runtimeClassName",
    ),
    "AppArmor unconfined": (
        "PodAnnotationNotAllowed",
        annotated(APPARMOR, "unconfined"),
        {"podAnnotationKeys": ["container.apparmor.security.beta.kubernetes.io/*"]},
        annotation_field(APPARMOR),
    ),
    "seccomp unconfined": (
        "PodAnnotationNotAllowed",
        annotated("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
        {"podAnnotationKeys": ["seccomp.security.alpha.kubernetes.io/pod"]},
        annotation_field("seccomp.security.alpha.kubernetes.io/pod"),
    ),
    "Istio injection off": (
        "PodAnnotationNotAllowed",
        annotated("sidecar.istio.io/inject", "false"),
        {"podAnnotationKeys": ["sidecar.istio.io/inject"]},
        annotation_field("sidecar.istio.io/inject"),
    ),
    "Linkerd injection disabled": (
        "PodAnnotationNotAllowed",
        annotated("linkerd.io/inject", "disabled"),
        {"podAnnotationKeys": ["*"]},
        annotation_field("linkerd.io/inject"),
    ),
    "a Multus network": (
        "PodAnnotationNotAllowed",
        annotated(NETWORKS, "rdma-net"),
        {"podAnnotationKeys": [NETWORKS]},
        annotation_field(NETWORKS),
    ),
    "a Multus network of another namespace": (
        "PodNetworkNotAllowed",
        annotated(NETWORKS, "rdma-net, kube-system/host-net@eth1"),
        {"networkNamespaces": ["kube-system"]},
        annotation_field(NETWORKS),
    ),
    "Multus' JSON form": (
        "PodNetworkNotAllowed",
        annotated(NETWORKS, '[{"name": "host-net", "NameSpace": "kube-system"}]'),
        {"networkNamespaces": ["*"]},
        annotation_field(NETWORKS),
    ),
}
# The policy a case starts from, where not the default: the read-only cases start with the directory
# allowed read-only.
STARTS = {
    "model hostPath writable": {"hostPaths": [{"pathPrefix": "/models"}]},
    "cache hostPath under a read-only prefix": {"hostPaths": [{"pathPrefix": "/cache"}]},
    "hostPath volume mounted writable": {"hostPaths": [{"pathPrefix": "/data"}]},
    "a Multus network of another namespace": {"podAnnotationKeys": [NETWORKS]},
    "Multus' JSON form": {"podAnnotationKeys": [NETWORKS]},
}


def spec_of(change: dict[str, Any]) -> Any:
    return validate_spec({**BASE, **change})


def base_policy(name: str) -> dict[str, Any]:
    return STARTS.get(name, {})


@pytest.mark.parametrize("name", CASES)
def test_the_escalation_is_refused_naming_field_and_rule(name: str) -> None:
    rule, change, _, field = CASES[name]
    found = violations(spec_of(change), TenancyPolicy.model_validate(base_policy(name)), namespace=NS)
    assert [(v.field_path, v.rule) for v in found] == [(field, rule)]
    assert found[0].line.startswith(f"{field}: ") and "policy." in found[0].message


@pytest.mark.parametrize("name", CASES)
def test_the_administrators_opt_in_admits_it(name: str) -> None:
    _, change, opt_in, _ = CASES[name]
    widened = TenancyPolicy.model_validate({**base_policy(name), **opt_in})
    assert violations(spec_of(change), widened, namespace=NS) == []


def test_every_rule_has_a_case() -> None:
    assert {rule.rule for rule in RULES} == {case[0] for case in CASES.values()}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_inside_the_default_policy_or_names_its_opt_in(path: Path) -> None:
    spec = validate_spec(yaml.safe_load(path.read_text())["spec"])
    if path.stem not in HOST_NETWORK_EXAMPLES:
        assert violations(spec, namespace=NS) == []
        return
    assert [v.rule for v in violations(spec, namespace=NS)] == ["HostNetworkNotAllowed"]
    assert violations(spec, TenancyPolicy(allow_host_network=True), namespace=NS) == []
    assert "allowHostNetwork: true" in path.read_text(), "the example documents the opt-in"


@pytest.mark.parametrize(
    "allowed",
    [
        {"image": "ghcr.io/pd-serving/pd-runtime@sha256:" + "a" * 64},
        {"image": "ghcr.io/pd-serving/pd-runtime"},
        {"modelStorage": {"hostPath": "/models", "readOnly": True}},
        {"modelStorage": {"hostPath": "/models/hf/", "readOnly": True}},
        {"node": {"tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
        {"gpuAllocation": {"strategy": "hostDevices"}},  # simulated engines are not privileged
        {"podTemplate": {"serviceAccountName": "default"}},
        {
            "podTemplate": {
                "volumes": [
                    {"name": "ro", "hostPath": {"path": "/models/x"}},
                    {"name": "cm", "configMap": {"name": "c"}},
                    {"name": "p", "projected": {"sources": [{"configMap": {"name": "c"}}]}},
                ],
                "volumeMounts": {"engine": [{"name": "ro", "mountPath": "/ro", "readOnly": True}]},
            }
        },
    ],
)
def test_what_the_policy_admits(allowed: dict[str, Any]) -> None:
    models = TenancyPolicy(host_paths=(HostPathPrefix(path_prefix="/models"),))
    assert violations(spec_of(allowed), models, namespace=NS) == []


@pytest.mark.parametrize("path", ["/modelsx", "/models/./x", "/models/..", "/models/../etc", "/"])
def test_a_host_path_is_under_a_prefix_by_whole_segments(path: str) -> None:
    models = TenancyPolicy(host_paths=(HostPathPrefix(path_prefix="/models"),))
    found = violations(spec_of({"modelStorage": {"hostPath": path, "readOnly": True}}), models, namespace=NS)
    assert [v.rule for v in found] == ["HostPathNotAllowed"]


@pytest.mark.parametrize(
    ("key", "patterns", "allowed"),
    [
        ("prometheus.io/scrape", ("prometheus.io/*",), True),
        ("prometheus.io.evil/x", ("prometheus.io/*",), False),
        ("prometheus.io", ("prometheus.io/*",), False),
        ("sidecar.istio.io/inject", ("sidecar.istio.io/status",), False),
        ("anything", ("*",), True),
        ("anything", (), False),
    ],
)
def test_an_annotation_key_is_a_key_or_under_a_pattern(key: str, patterns: tuple[str, ...], allowed: bool) -> None:
    assert policy.annotation_allowed(key, patterns) is allowed


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("rdma-net", True),
        (f"{NS}/rdma-net@net1,other", True),  # no namespace: the pod's own
        ("shared/rdma-net", True),
        ("kube-system/host-net", False),
        ("rdma-net, kube-system/host-net", False),
        (" team-a /rdma-net,\u3000shared/x", True),  # the namespace trimmed as Multus (Go) trims it
        ("\x1cteam-a/rdma-net", False),  # not space to Go: the namespace "\x1cteam-a"
        ('[{"name": "rdma-net"}]', False),  # the JSON form: namespace keys of any case or escape
        ('{"name": "rdma-net"}', False),
    ],
)
def test_multus_networks_are_of_the_own_namespace_or_a_listed_one(value: str, allowed: bool) -> None:
    shared = TenancyPolicy(pod_annotation_keys=(NETWORKS,), network_namespaces=("shared",))
    assert (violations(spec_of(annotated(NETWORKS, value)), shared, namespace=NS) == []) is allowed


def test_an_annotation_pattern_has_its_star_last() -> None:
    with pytest.raises(ValueError, match="pattern"):
        TenancyPolicy.model_validate({"podAnnotationKeys": ["a*b"]})


def test_enforce_names_the_first_rule_as_reason() -> None:
    with pytest.raises(SpecError) as caught:
        policy.enforce(spec_of({"image": "x:1", "proxy": {"serviceType": "NodePort"}}), DEFAULT_POLICY, namespace=NS)
    assert caught.value.reason == "ImageNotAllowed"
    assert [p.split(":")[0] for p in caught.value.problems] == ["spec.image", "spec.proxy.serviceType"]


def test_a_policy_file_loads_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text(yaml.safe_dump({"images": ["r/"], "hostPaths": [{"pathPrefix": "/m", "readOnly": False}]}))
    assert policy_file.read(good) == TenancyPolicy(
        images=("r/",), host_paths=(WRITABLE_MODELS.model_copy(update={"path_prefix": "/m"}),)
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("imagez: []\n")
    with pytest.raises(policy_file.PolicyError, match="imagez"):
        policy_file.read(bad)
    with pytest.raises(policy_file.PolicyError):
        policy_file.read(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert policy_file.read(empty) == policy_file.read(None) == DEFAULT_POLICY


# ---- the operator refuses to reconcile -------------------------------------------------------------------------


def test_the_operator_refuses_a_spec_outside_the_policy_and_creates_nothing() -> None:
    spec = {**BASE, "node": {"priorityClassName": "system-cluster-critical"}}
    decision = decide.decide(Snapshot(Deployment("demo", "ns", "uid", 1, spec), T0))
    cond = next(c for c in decision.status.conditions if c.type == "SpecValid")
    assert (cond.status, cond.reason) == ("False", "PriorityClassNotAllowed")
    assert cond.message.startswith("spec.node.priorityClassName: ")
    assert all(isinstance(a, Emit) for a in decision.actions)
    assert ("Warning", "PriorityClassNotAllowed") in [(e.type, e.reason) for e in decision.events]
    widened = TenancyPolicy(priority_class_names=("system-cluster-critical",))
    admitted = decide.decide(Snapshot(Deployment("demo", "ns", "uid", 1, spec, tenancy=widened), T0))
    assert any(a.key.startswith("create Pod/") for a in admitted.actions)


# ---- pdctl render --------------------------------------------------------------------------------------------------


def write(tmp_path: Path, spec: dict[str, Any]) -> Path:
    doc = {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "x"}, "spec": spec}
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_render_refuses_a_spec_outside_the_default_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {**BASE, "proxy": {"serviceType": "LoadBalancer"}})
    assert render_command.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "spec.proxy.serviceType: the Service type is not in the allowed types" in err
    assert "policy.serviceTypes" in err


@pytest.mark.parametrize("name", CASES)
def test_render_refuses_each_escalation_naming_the_field(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, change, _, field = CASES[name]
    path = write(tmp_path, {**BASE, **change})
    start = tmp_path / "policy.yaml"
    start.write_text(json.dumps(base_policy(name)))
    assert render_command.main([str(path), "-n", NS, "--policy", str(start)]) == 2
    [refusal] = violations(spec_of(change), TenancyPolicy.model_validate(base_policy(name)), namespace=NS)
    assert refusal.field_path == field and f"  {refusal.line}\n" in capsys.readouterr().err


def test_the_operator_admits_networks_of_the_deployments_own_namespace_only() -> None:
    tenancy = TenancyPolicy(pod_annotation_keys=(NETWORKS,))

    def spec_valid(namespace: str) -> tuple[str, str]:
        spec = {**BASE, **annotated(NETWORKS, "team-a/rdma-net")}
        decision = decide.decide(Snapshot(Deployment("demo", namespace, "uid", 1, spec, tenancy=tenancy), T0))
        cond = next(c for c in decision.status.conditions if c.type == "SpecValid")
        return cond.status, cond.reason

    assert spec_valid("team-a")[0] == "True"
    assert spec_valid("team-b") == ("False", "PodNetworkNotAllowed")


def test_render_applies_another_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {**BASE, "proxy": {"serviceType": "LoadBalancer"}})
    wide = tmp_path / "policy.yaml"
    wide.write_text(json.dumps({"serviceTypes": ["ClusterIP", "LoadBalancer"]}))
    assert render_command.main([str(path), "--policy", str(wide)]) == 0
    assert "type: LoadBalancer" in capsys.readouterr().out
    assert render_command.main([str(path), "--policy", str(tmp_path / "none.yaml")]) == 2
