"""spec.router: the router's Deployment, Service and least-privilege RBAC, its NetworkPolicy rule, and its
removal when disabled."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator import decide, layout, render
from pd_operator.decide import Apply, Delete, Deployment, Snapshot
from pd_operator.validation import SpecError, validate_spec
from tests.chart.test_chart_rbac import NAMESPACED_NEEDS
from tests.operator.test_decide import T0

NS, NAME, UID = "ns1", "demo", "uid-1"
OWNER = layout.Owner(NAME, NS, UID, 1)
ROUTED: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2, "router": {"enabled": True}}
PLAIN: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2}


def applied(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    children = render.children(layout.build(OWNER, validate_spec(spec)))
    return {(o["kind"], o["metadata"]["name"]): o for o in children.applied}


def snapshot(spec: dict[str, Any], repair: bool = True, router_found: bool = False) -> Snapshot:
    deployment = Deployment(NAME, NS, UID, 1, spec, {}, {})
    return Snapshot(deployment, T0, repair_children=repair, router_found=router_found)


def test_disabled_by_default_renders_no_router_and_no_router_ingress() -> None:
    objs = applied(PLAIN)
    assert not [key for key in objs if key[1] == "demo-router"]
    rules = objs[("NetworkPolicy", NAME)]["spec"]["ingress"]
    assert all("router" not in str(r) for r in rules)


def test_enabled_renders_owned_deployment_service_and_rbac() -> None:
    objs = applied(ROUTED)
    router = {key: o for key, o in objs.items() if key[1] == "demo-router"}
    assert sorted(kind for kind, _ in router) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    for obj in router.values():
        assert obj["metadata"]["namespace"] == NS
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("PDDeployment", NAME, UID, True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    kinds = [o["kind"] for o in render.router(layout.build(OWNER, validate_spec(ROUTED)))]
    assert kinds.index("Deployment") > max(kinds.index(k) for k in ("ServiceAccount", "Role", "RoleBinding"))


def test_router_pods_run_pdctl_proxy_router_restricted_with_their_own_account() -> None:
    dep = applied(ROUTED)[("Deployment", "demo-router")]
    assert dep["spec"]["replicas"] == 2
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector == {"pd.serving.dev/deployment": NAME, "app.kubernetes.io/component": "router"}
    template = dep["spec"]["template"]
    assert all(template["metadata"]["labels"][k] == v for k, v in selector.items())
    pod = template["spec"]
    assert pod["serviceAccountName"] == "demo-router" and pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["command"] == [
        "pdctl", "proxy", "--router", "--pddeployment", NAME, "--namespace", NS,
        "--host", "0.0.0.0", "--port", "8000", "--backend-port", "8000", "--admin-port", "8001",
    ]  # fmt: skip
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_router_ports_follow_the_proxy_ports() -> None:
    spec = {**ROUTED, "proxy": {"port": 9000, "adminPort": 9001}}
    dep = applied(spec)[("Deployment", "demo-router")]
    argv = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--port") + 1] == argv[argv.index("--backend-port") + 1] == "9000"
    assert argv[argv.index("--admin-port") + 1] == "9001"
    (port,) = applied(spec)[("Service", "demo-router")]["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (9000, "http")


def test_router_service_exposes_only_the_api_port_and_selects_only_router_pods() -> None:
    svc = applied(ROUTED)[("Service", "demo-router")]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http"]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    serving = applied(ROUTED)[("Service", NAME)]
    assert serving["spec"]["selector"]["app.kubernetes.io/component"] == "serving"


def test_router_role_reads_endpointslices_in_its_namespace_only() -> None:
    objs = applied(ROUTED)
    role = objs[("Role", "demo-router")]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    binding = objs[("RoleBinding", "demo-router")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "demo-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-router", "namespace": NS}]


def test_the_operator_holds_what_it_grants_the_router() -> None:
    """RBAC's escalation rule: a Role may only grant what its creator holds."""
    for rule in render.ROUTER_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= set(NAMESPACED_NEEDS[(group, resource)].split())


def test_network_policy_admits_router_pods_to_api_and_admin_ports() -> None:
    rules = applied(ROUTED)[("NetworkPolicy", NAME)]["spec"]["ingress"]
    router_peer = [{"podSelector": {"matchLabels": render.router_selector(OWNER)}}]
    (rule,) = [r for r in rules if r.get("from") == router_peer]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}, {"port": 8001, "protocol": "TCP"}]


def test_router_replicas_are_validated() -> None:
    assert (
        applied({**ROUTED, "router": {"enabled": True, "replicas": 3}})[("Deployment", "demo-router")]["spec"][
            "replicas"
        ]
        == 3
    )
    with pytest.raises(SpecError, match="router"):
        validate_spec({**ROUTED, "router": {"enabled": True, "replicas": 0}})


def test_enabled_router_is_applied_on_repairs() -> None:
    decision = decide.decide(snapshot(ROUTED))
    kinds = {
        a.obj["kind"] for a in decision.actions if isinstance(a, Apply) and a.obj["metadata"]["name"] == "demo-router"
    }
    assert kinds == {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    assert not [a for a in decision.actions if isinstance(a, Delete)]


def test_the_router_is_looked_up_only_on_repairs_of_a_spec_without_it() -> None:
    assert decide.router_lookup(snapshot(PLAIN)) == "demo-router"
    assert decide.router_lookup(snapshot(PLAIN, repair=False)) is None
    assert decide.router_lookup(snapshot(ROUTED)) is None


def test_disabling_deletes_every_router_object_the_deployment_last() -> None:
    assert not [a for a in decide.decide(snapshot(PLAIN)).actions if isinstance(a, Delete)]
    decision = decide.decide(snapshot(PLAIN, router_found=True))
    deletes = [(a.kind, a.name) for a in decision.actions if isinstance(a, Delete)]
    assert deletes == [(k, "demo-router") for k in ("Service", "RoleBinding", "Role", "ServiceAccount", "Deployment")]
