"""The tenancy policy on the real API server (docs/security.md).

A tenant whose ServiceAccount may only create (and read) PDDeployments in its namespace asks for each way a
PDDeployment used to amount to root on a node: the chart's ValidatingAdmissionPolicy refuses every one at
`kubectl create`, naming the field, with the chart's defaults; the same specs are admitted once the
administrator widens the chart's values; and with the admission policy switched off, the operator itself
refuses a spec outside its policy (SpecValid False naming the rule, an Event, no pod).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import SUITE_POLICY, Stack
from e2e.tests.kube import condition, create_namespace, get, pdd, pdd_events, wait_for
from pd_operator.policy import DEFAULT_POLICY, NETWORKS_ANNOTATION, RULES, TenancyPolicy, violations
from pd_operator.validation import validate_spec

Obj = dict[str, Any]
NO_NODE = {"pd.serving.dev/e2e": "no-such-node"}  # admitted specs stay Pending: no pod runs their escalation
CONTROL_PLANE = {"node-role.kubernetes.io/control-plane": ""}
PKI = {"name": "pki", "hostPath": {"path": "/etc/kubernetes/pki"}}
TOKEN = {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
APPARMOR = "container.apparmor.security.beta.kubernetes.io/engine-0"
NETWORKS = NETWORKS_ANNOTATION
ANNOTATIONS = "spec.podTemplate.metadata.annotations[*]"


def annotated(key: str, value: str) -> Obj:
    return {"podTemplate": {"metadata": {"annotations": {key: value}}}}


# escalation -> (the spec's change, the rule, the field the refusal names)
ESCALATIONS: dict[str, tuple[Obj, str, str]] = {
    "image outside the prefixes": ({"image": "docker.io/library/ubuntu:24.04"}, "ImageNotAllowed", "spec.image"),
    "model hostPath /": ({"modelStorage": {"hostPath": "/"}}, "HostPathNotAllowed", "spec.modelStorage.hostPath"),
    "hostPath volume /etc/kubernetes/pki": (
        {"podTemplate": {"volumes": [PKI], "volumeMounts": {"proxy": [{"name": "pki", "mountPath": "/pki"}]}}},
        "HostPathNotAllowed",
        "spec.podTemplate.volumes[*].hostPath.path",
    ),
    "projected ServiceAccount token": (
        {"podTemplate": {"volumes": [TOKEN]}},
        "ServiceAccountTokenNotAllowed",
        "spec.podTemplate.volumes[*].projected.sources[*].serviceAccountToken",
    ),
    "serviceAccountName": (
        {"podTemplate": {"serviceAccountName": "operator-like"}},
        "ServiceAccountNotAllowed",
        "spec.podTemplate.serviceAccountName",
    ),
    "toleration Exists with a control-plane selector": (
        {"node": {"tolerations": [{"operator": "Exists"}], "nodeSelector": CONTROL_PLANE}},
        "TolerationNotAllowed",
        "spec.node.tolerations[*].key",
    ),
    "system-cluster-critical": (
        {"node": {"priorityClassName": "system-cluster-critical"}},
        "PriorityClassNotAllowed",
        "spec.node.priorityClassName",
    ),
    "hostDevices": (
        {"engine": "vllm", "gpuAllocation": {"strategy": "hostDevices"}},  # privileged with real engines only
        "PrivilegedNotAllowed",
        "spec.gpuAllocation.strategy",
    ),
    "serviceType LoadBalancer": (
        {"proxy": {"serviceType": "LoadBalancer"}},
        "ServiceTypeNotAllowed",
        "spec.proxy.serviceType",
    ),
    "runtimeClassName": (
        {"podTemplate": {"runtimeClassName": "nvidia-privileged"}},
        "RuntimeClassNotAllowed",
        "spec.podTemplate.runtimeClassName",
    ),
    "AppArmor unconfined": (annotated(APPARMOR, "unconfined"), "PodAnnotationNotAllowed", ANNOTATIONS),
    "Istio injection off": (annotated("sidecar.istio.io/inject", "false"), "PodAnnotationNotAllowed", ANNOTATIONS),
    "a Multus network": (annotated(NETWORKS, "rdma-net"), "PodAnnotationNotAllowed", ANNOTATIONS),
}
# The administrator's opt-ins for all of them (chart values policy:, over the chart's defaults).
WIDENED: Obj = {
    "images": ["ghcr.io/pd-serving/pd-runtime", "docker.io/library/ubuntu"],
    "hostPaths": [{"pathPrefix": "/", "readOnly": False}],
    "allowServiceAccountTokens": True,
    "serviceAccountNames": ["operator-like"],
    "tolerationKeys": [""],
    "priorityClassNames": ["system-cluster-critical"],
    "allowPrivileged": True,
    "serviceTypes": ["ClusterIP", "LoadBalancer"],
    "runtimeClassNames": ["nvidia-privileged"],
    "podAnnotationKeys": ["container.apparmor.security.beta.kubernetes.io/*", "sidecar.istio.io/inject", NETWORKS],
    "networkNamespaces": ["shared"],
    "allowHostNetwork": True,  # the RDMA examples that need the node's network namespace
}
TENANT_ROLE: Obj = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "pddeployment-author"},
    "rules": [
        {"apiGroups": ["pd.serving.dev"], "resources": ["pddeployments"], "verbs": ["create", "get", "list", "watch"]}
    ],
}


def message_of(rule: str, field: str) -> str:
    """The admission message of the rule at this field, as the chart's policy renders it from policy.RULES."""
    return next(r.validation()["message"] for r in RULES if r.rule == rule and r.field == field)


def host_network(example: Obj) -> bool:
    return bool(example["spec"].get("kvTransfer", {}).get("rdma", {}).get("hostNetwork"))


def manifest(name: str, change: Obj) -> Obj:
    node = {"nodeSelector": NO_NODE, **change.get("node", {})}
    spec = {"model": "m", "engine": "simulated", **change, "node": node}
    return {"apiVersion": "pd.serving.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": name}, "spec": spec}


class Tenant:
    """kubectl with the token of a ServiceAccount that may only create and read PDDeployments in `namespace`."""

    def __init__(self, cp: ControlPlane, namespace: str, kubeconfig: Path) -> None:
        self.cp, self.namespace, self.kubeconfig = cp, namespace, kubeconfig

    def create(self, obj: Obj, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
        args = ["create", "-n", self.namespace, "-f", "-", *(["--dry-run=server"] if dry_run else [])]
        env = {**self.cp.env(), "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run(
            [self.cp.tool("kubectl"), *args], env=env, input=json.dumps(obj), capture_output=True, text=True, timeout=60
        )

    def can(self, verb: str, resource: str) -> bool:
        env = {**self.cp.env(), "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [self.cp.tool("kubectl"), "auth", "can-i", verb, resource, "-n", self.namespace],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def tenant(operator: Stack, cp: ControlPlane) -> Iterator[Tenant]:
    namespace = create_namespace(cp, f"tenant-{secrets.token_hex(3)}", "privileged")
    cp.kubectl("create", "serviceaccount", "author", "-n", namespace)
    cp.kubectl("create", "-n", namespace, "-f", "-", input_text=json.dumps(TENANT_ROLE))
    cp.kubectl(
        "create",
        "rolebinding",
        "author",
        "-n",
        namespace,
        "--role=pddeployment-author",
        f"--serviceaccount={namespace}:author",
    )
    kubeconfig = cp.service_account_kubeconfig(namespace, "author", cp.workdir / "tenant.kubeconfig")
    try:
        yield Tenant(cp, namespace, kubeconfig)
    finally:
        operator.install_operator()  # the suite's policy again
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def install_policy(operator: Stack, tenant: Tenant, policy: Obj | None, probes: list[Obj], admitted: bool) -> None:
    """Install the chart with this policy and wait until the API server enforces it (policies load async):
    every probe spec admitted, or every one refused (one probe is not enough: the policy in force before
    may refuse it too, and then the wait would end before the new one is loaded)."""
    operator.install_operator(policy=policy)

    def enforced() -> bool | None:
        return all((tenant.create(p, dry_run=True).returncode == 0) == admitted for p in probes) or None

    wait_for(enforced, 90, f"the admission policy {'admitting' if admitted else 'refusing'} the probe specs", 0.5)


def test_the_tenant_may_only_create_and_read_pddeployments(tenant: Tenant) -> None:
    assert tenant.can("create", "pddeployments.pd.serving.dev")
    assert not tenant.can("create", "pods") and not tenant.can("get", "secrets")


def test_each_escalation_is_refused_at_apply_and_admitted_after_the_opt_in(operator: Stack, tenant: Tenant) -> None:
    objs = {name: manifest(f"esc-{i}", change) for i, (name, (change, _, _)) in enumerate(ESCALATIONS.items())}
    install_policy(operator, tenant, None, list(objs.values()), admitted=False)  # the chart's defaults
    for name, (_, rule, field) in ESCALATIONS.items():
        proc = tenant.create(objs[name])
        assert proc.returncode != 0, f"{name}: admitted with the chart's defaults"
        assert "ValidatingAdmissionPolicy" in proc.stderr and "tenancy" in proc.stderr, proc.stderr
        assert message_of(rule, field) in proc.stderr, proc.stderr
        # The operator's Python check refuses the same spec for the same rule (pdctl render, SpecValid).
        spec = validate_spec(objs[name]["spec"])
        assert [v.rule for v in violations(spec, DEFAULT_POLICY, namespace=tenant.namespace)] == [rule]
        assert pdd(tenant.cp, tenant.namespace, objs[name]["metadata"]["name"]) is None
    examples = {path.name: yaml.safe_load(path.read_text()) for path in sorted((REPO_ROOT / "examples").glob("*.yaml"))}
    on_host_network = {name for name, obj in examples.items() if host_network(obj)}
    assert on_host_network, "the RDMA examples that name the host-network opt-in"
    for name, example in examples.items():  # the defaults admit every example but those that name the opt-in
        proc = tenant.create(example, dry_run=True)
        if name in on_host_network:
            assert message_of("HostNetworkNotAllowed", "spec.kvTransfer.rdma.hostNetwork") in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 0, f"{name}: {proc.stderr}"
    install_policy(operator, tenant, WIDENED, list(objs.values()), admitted=True)
    for name in sorted(on_host_network):
        proc = tenant.create(examples[name], dry_run=True)
        assert proc.returncode == 0, f"{name}: refused after the opt-in: {proc.stderr}"
    widened = TenancyPolicy.model_validate(WIDENED)
    for name, obj in objs.items():
        proc = tenant.create(obj)
        assert proc.returncode == 0, f"{name}: refused after the opt-in: {proc.stderr}"
        assert violations(validate_spec(obj["spec"]), widened, namespace=tenant.namespace) == []
        assert pdd(tenant.cp, tenant.namespace, obj["metadata"]["name"]) is not None
    check_networks(tenant, widened)


def check_networks(tenant: Tenant, widened: TenancyPolicy) -> None:
    """With the Multus annotation allowed: networks of the tenant's own namespace (request.namespace) and of
    policy.networkNamespaces are admitted, others and the JSON form refused, as the Python rule says."""
    values = {
        f"{tenant.namespace}/rdma-net, plain@net1": True,
        "shared/rdma-net": True,
        "kube-system/host-net": False,
        '[{"name": "rdma-net"}]': False,
    }
    field = f'spec.podTemplate.metadata.annotations["{NETWORKS}"]'
    for i, (value, allowed) in enumerate(values.items()):
        obj = manifest(f"net-{i}", annotated(NETWORKS, value))
        proc = tenant.create(obj, dry_run=True)
        assert (proc.returncode == 0) is allowed, f"{value}: {proc.stderr}"
        assert allowed or message_of("PodNetworkNotAllowed", field) in proc.stderr, proc.stderr
        found = violations(validate_spec(obj["spec"]), widened, namespace=tenant.namespace)
        assert [v.rule for v in found] == ([] if allowed else ["PodNetworkNotAllowed"])


def test_the_operator_refuses_what_its_policy_does_not_allow_without_admission(
    operator: Stack, cp: ControlPlane, tenant: Tenant
) -> None:
    """The operator runs with the suite's policy, which still refuses system-cluster-critical."""
    change, rule, field = ESCALATIONS["system-cluster-critical"]
    assert "priorityClassNames" not in SUITE_POLICY
    obj = manifest("no-admission", change)
    install_policy(operator, tenant, {**SUITE_POLICY, "admission": False}, [obj], admitted=True)
    proc = tenant.create(obj)
    assert proc.returncode == 0, proc.stderr

    def refused() -> Obj | None:
        found = condition(pdd(cp, tenant.namespace, "no-admission"), "SpecValid")
        return found if found and found["status"] == "False" else None

    spec_valid = wait_for(refused, 60, "SpecValid False")
    assert spec_valid["reason"] == rule, spec_valid
    assert spec_valid["message"].startswith(f"{field}: "), spec_valid
    [event] = wait_for(lambda: pdd_events(cp, tenant.namespace, "no-admission", rule), 30, f"a {rule} Event")
    assert event["type"] == "Warning" and event["message"] == spec_valid["message"]
    for kind in ("pods", "services"):  # the serving pod and its Service would have the deployment's name
        assert get(cp, f"/api/v1/namespaces/{tenant.namespace}/{kind}/no-admission") is None
