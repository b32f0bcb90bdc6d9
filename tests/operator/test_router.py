"""spec.router: the router's Deployment, Service, least-privilege RBAC, NetworkPolicy, PodDisruptionBudget
and anti-affinity, the serving NetworkPolicy's rule for it, and its removal when disabled."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pd_operator import decide, kube, layout, render
from pd_operator.actions import Apply, Delete
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError, validate_spec
from pd_operator.views import ObjectView, OwnerRef
from tests.chart.test_chart_rbac import NAMESPACED_NEEDS
from tests.operator.test_decide import T0

NS, NAME, UID = "ns1", "demo", "uid-1"
OWNER = layout.Owner(NAME, NS, UID, 1)
ROUTED: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2, "router": {"enabled": True}}
PLAIN: dict[str, Any] = {"model": "m", "engine": "simulated", "replicas": 2}
ONE_ROUTER: dict[str, Any] = {**ROUTED, "router": {"enabled": True, "replicas": 1}}


def applied(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    children = render.children(layout.build(OWNER, validate_spec(spec)))
    return {(o["kind"], o["metadata"]["name"]): o for o in children.applied}


def seen(targets: list[tuple[str, str]], owner_uid: str = UID) -> dict[str, ObjectView | None]:
    """What the shell read of ``targets``: each object there, owned by the PDDeployment of ``owner_uid``."""
    owner = (OwnerRef("PDDeployment", NAME, owner_uid),)
    return {f"{k}/{n}": ObjectView(k, n, f"uid-{k}-{n}", owner) for k, n in targets}


ROUTER_OBJECTS = [(kind, "demo-router") for kind in render.ROUTER_KINDS]


def snapshot(spec: dict[str, Any], repair: bool = True, router_found: bool = False) -> Snapshot:
    deployment = Deployment(NAME, NS, UID, 1, spec, {}, {})
    return Snapshot(deployment, T0, repair_children=repair, seen=seen(ROUTER_OBJECTS) if router_found else {})


def reads(snap: Snapshot) -> list[tuple[str, str]]:
    return decide.object_reads(snap, decide.applied_children(snap))


def test_disabled_by_default_renders_no_router_and_no_router_ingress() -> None:
    objs = applied(PLAIN)
    assert not [key for key in objs if key[1] == "demo-router"]
    rules = objs[("NetworkPolicy", NAME)]["spec"]["ingress"]
    assert all("router" not in str(r) for r in rules)


def test_enabled_renders_owned_deployment_service_and_rbac() -> None:
    objs = applied(ROUTED)
    router = {key: o for key, o in objs.items() if key[1] == "demo-router"}
    assert sorted(kind for kind, _ in router) == sorted(render.ROUTER_KINDS)
    for obj in router.values():
        assert obj["metadata"]["namespace"] == NS
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("PDDeployment", NAME, UID, True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    kinds = [o["kind"] for o in render.router(layout.build(OWNER, validate_spec(ROUTED)))]
    before = ("ServiceAccount", "Role", "RoleBinding", "NetworkPolicy")
    assert kinds.index("Deployment") > max(kinds.index(k) for k in before)


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
    assert kinds == set(render.ROUTER_KINDS)
    assert not [a for a in decision.actions if isinstance(a, Delete)]


def test_the_router_is_looked_up_only_on_repairs_of_a_spec_that_renders_less() -> None:
    assert ("Deployment", "demo-router") in reads(snapshot(PLAIN))
    assert reads(snapshot(PLAIN, repair=False)) == []
    assert not [t for t in reads(snapshot(ROUTED)) if t[1] == "demo-router" and t not in applied(ROUTED)]
    assert ("PodDisruptionBudget", "demo-router") in reads(snapshot(ONE_ROUTER))
    assert reads(snapshot({**PLAIN, "replicas": -1})) == []  # invalid: decide reports it


def router_reads(snap: Snapshot) -> list[tuple[str, str]]:
    return [t for t in reads(snap) if t[1] == "demo-router"]


def test_a_router_deployment_of_ours_is_read_with_everything_it_takes_along() -> None:
    deployment_only = dataclasses.replace(snapshot(PLAIN), seen=seen([("Deployment", "demo-router")]))
    assert router_reads(deployment_only) == ROUTER_OBJECTS[:-1]  # the Deployment was read already
    foreign = dataclasses.replace(snapshot(PLAIN), seen=seen([("Deployment", "demo-router")], owner_uid="other"))
    assert router_reads(foreign) == []


def deletes_of(seen_objects: dict[str, ObjectView | None]) -> list[tuple[str, str, str | None]]:
    decision = decide.decide(dataclasses.replace(snapshot(PLAIN), seen=seen_objects))
    return [(a.kind, a.name, a.uid) for a in decision.actions if isinstance(a, Delete)]


def test_disabling_deletes_every_router_object_the_deployment_last() -> None:
    assert not [a for a in decide.decide(snapshot(PLAIN)).actions if isinstance(a, Delete)]
    deletes = deletes_of(seen(ROUTER_OBJECTS))
    assert deletes == [(k, "demo-router", f"uid-{k}-demo-router") for k in render.ROUTER_KINDS]  # uid: precondition
    assert deletes[-1][0] == "Deployment"
    assert {kind for kind, _, _ in deletes} == {kind for kind, name in applied(ROUTED) if name == "demo-router"}


def test_another_teams_router_objects_are_never_deleted() -> None:
    """Router disabled, and a Deployment NAME-router of someone else's: neither it nor the objects of that
    name are deleted; of those, only ours are (each with its uid as precondition)."""
    theirs = seen(ROUTER_OBJECTS, owner_uid="other-team")
    assert deletes_of(theirs) == []
    mixed = {**theirs, **seen([("Deployment", "demo-router"), ("Service", "demo-router")])}
    assert [d[0] for d in deletes_of(mixed)] == ["Service", "Deployment"]
    # no owner at all, even with our labels: a leftover is deleted only when its owner reference says ours
    labelled = ObjectView("Deployment", "demo-router", "u", (), render.labels(OWNER, "router"))
    assert deletes_of({"Deployment/demo-router": labelled}) == []


def test_the_operator_may_read_and_delete_what_it_cleans_up() -> None:
    for kind in render.ROUTER_KINDS:
        api_version, resource = kube.KINDS[kind].api_version, kube.KINDS[kind].plural
        group = api_version.rpartition("/")[0]
        verbs = set(NAMESPACED_NEEDS[(group, resource)].split())
        assert "delete" in verbs, kind
        assert "get" in verbs, kind  # read before applied or deleted: whose it is


# ---- what a cluster operator expects around the router pods ----------------------------------------------


def test_a_disruption_budget_with_more_than_one_router_pod_only() -> None:
    pdb = applied(ROUTED)[("PodDisruptionBudget", "demo-router")]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": render.router_selector(OWNER)}}
    assert ("PodDisruptionBudget", "demo-router") not in applied(ONE_ROUTER)
    assert ("Deployment", "demo-router") in applied(ONE_ROUTER)
    # the serving pods' own budget is untouched
    assert applied(ROUTED)[("PodDisruptionBudget", NAME)]["spec"]["selector"]["matchLabels"] == (
        render.serving_selector(OWNER)
    )


def test_going_down_to_one_router_pod_deletes_its_budget_only() -> None:
    assert not [a for a in decide.decide(snapshot(ONE_ROUTER)).actions if isinstance(a, Delete)]
    decision = decide.decide(snapshot(ONE_ROUTER, router_found=True))
    assert [(a.kind, a.name) for a in decision.actions if isinstance(a, Delete)] == [
        ("PodDisruptionBudget", "demo-router")
    ]
    # found while more than one pod is rendered (a lookup racing a spec change): never delete what is applied
    assert not [a for a in decide.decide(snapshot(ROUTED, router_found=True)).actions if isinstance(a, Delete)]


def test_router_pods_prefer_different_nodes_but_never_wait_for_one() -> None:
    affinity = applied(ROUTED)[("Deployment", "demo-router")]["spec"]["template"]["spec"]["affinity"]
    assert list(affinity) == ["podAntiAffinity"]
    anti = affinity["podAntiAffinity"]
    assert list(anti) == ["preferredDuringSchedulingIgnoredDuringExecution"]  # soft: no required term
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": render.router_selector(OWNER)},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert 1 <= term["weight"] <= 100


def test_router_network_policy_admits_its_api_port_and_lets_out_only_replicas_api_server_and_dns() -> None:
    spec = {**ROUTED, "proxy": {"port": 9000, "adminPort": 9001}}
    policy = applied(spec)[("NetworkPolicy", "demo-router")]["spec"]
    assert policy["podSelector"] == {"matchLabels": render.router_selector(OWNER)}
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # in: its only port, from anywhere (like the serving API port; scrapers included)
    assert policy["ingress"] == [{"ports": [{"port": 9000, "protocol": "TCP"}]}]
    serving_api = applied(spec)[("NetworkPolicy", NAME)]["spec"]["ingress"][0]
    assert serving_api == {"ports": [{"port": 9000, "protocol": "TCP"}]}
    replicas, api_server, dns = policy["egress"]
    assert replicas == {
        "to": [{"podSelector": {"matchLabels": render.serving_selector(OWNER)}}],
        "ports": [{"port": 9000, "protocol": "TCP"}, {"port": 9001, "protocol": "TCP"}],
    }
    assert api_server == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}


def test_the_serving_pods_own_network_policy_does_not_select_router_pods() -> None:
    serving = applied(ROUTED)[("NetworkPolicy", NAME)]["spec"]["podSelector"]["matchLabels"]
    router_labels = applied(ROUTED)[("Deployment", "demo-router")]["spec"]["template"]["metadata"]["labels"]
    assert not all(router_labels.get(k) == v for k, v in serving.items())
