"""The chart grants exactly the operator's RBAC needs (team contract 5), no more, in both scopes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.chart.chart_helpers import NAMESPACE, VALUES_DIR, documents, find, render

Grant = tuple[str, str, str, str]  # (namespace or "*" for cluster-wide, apiGroup, resource, verb)

NAMESPACED_NEEDS: dict[tuple[str, str], str] = {
    ("pd.serving.dev", "pddeployments"): "get list watch patch",
    ("pd.serving.dev", "pddeployments/status"): "get patch update",
    ("pd.serving.dev", "pddeployments/finalizers"): "update",  # blockOwnerDeletion on every child
    ("pd.serving.dev", "pddeployments/scale"): "get patch",  # spec.autoscaling writes replicas as kubectl scale does
    ("autoscaling", "horizontalpodautoscalers"): "list",  # one owner of replicas: an HPA on the object wins
    ("", "pods"): "get list watch create delete patch",
    ("", "services"): "get list watch create patch delete",
    ("", "configmaps"): "get create patch",  # the proxy's settings: read before applied (who holds it), applied
    ("", "secrets"): "get create",  # the pod's credentials: created once, read for the admin key; never listed
    ("", "events"): "create patch",
    ("events.k8s.io", "events"): "create patch",
    ("networking.k8s.io", "networkpolicies"): "get list watch create patch delete",
    ("batch", "jobs"): "get list watch create delete",
    ("policy", "poddisruptionbudgets"): "get create patch delete",  # applied; the router's read and deleted
    # spec.router: applied, deleted when disabled; EndpointSlices only to grant them to the router (escalation)
    ("apps", "deployments"): "get create patch delete",
    ("", "serviceaccounts"): "get create patch delete",
    ("rbac.authorization.k8s.io", "roles"): "get create patch delete",
    ("rbac.authorization.k8s.io", "rolebindings"): "get create patch delete",
    ("discovery.k8s.io", "endpointslices"): "get list watch",
    ("inference.networking.k8s.io", "inferencepools"): "get create patch delete",  # spec.inferencePool
}
CLUSTER_NEEDS: dict[tuple[str, str], str] = {
    ("", "namespaces"): "list watch",
    ("", "nodes"): "list watch",
    ("apiextensions.k8s.io", "customresourcedefinitions"): "list watch",
}
PEERING_VERBS = "get list watch patch"


def grants(scope: str, needs: dict[tuple[str, str], str]) -> set[Grant]:
    return {(scope, group, resource, verb) for (group, resource), verbs in needs.items() for verb in verbs.split()}


def rendered_grants(docs: list[dict[str, Any]]) -> set[Grant]:
    """Every (scope, group, resource, verb) the chart's bindings give the operator's ServiceAccount."""
    roles = {
        (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]): doc
        for doc in docs
        if doc["kind"] in ("Role", "ClusterRole")
    }
    result: set[Grant] = set()
    for binding in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pd-pd-operator", "namespace": NAMESPACE}]
        scope = binding["metadata"].get("namespace", "*")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            result |= {(scope, g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return result


def test_cluster_mode_grants_exactly_the_contract(helm: Path) -> None:
    expected = grants("*", NAMESPACED_NEEDS) | grants("*", CLUSTER_NEEDS)
    expected |= grants("*", {("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS})
    assert rendered_grants(documents(render(helm))) == expected


def test_dra_rights_only_when_asked_for(helm: Path) -> None:
    """ResourceClaimTemplates are needed only by the dra GPU strategy, so they are opt-in."""
    claim_templates = grants(
        "*",
        {
            ("resource.k8s.io", "resourceclaimtemplates"): "get list watch create patch delete",
            ("resource.k8s.io", "resourceclaims"): "get",  # the allocation, read back into status.gpuAssignment
        },
    )
    assert not claim_templates & rendered_grants(documents(render(helm)))
    with_dra = rendered_grants(documents(render(helm, sets=["rbac.dynamicResourceAllocation=true"])))
    assert with_dra == rendered_grants(documents(render(helm))) | claim_templates


def test_namespaced_mode_grants_namespaced_verbs_only_in_watched_namespaces(helm: Path) -> None:
    docs = documents(render(helm, [VALUES_DIR / "namespaced.yaml"]))
    expected = grants("*", CLUSTER_NEEDS)
    for namespace in ("team-a", "team-b"):
        expected |= grants(namespace, NAMESPACED_NEEDS)
        expected |= grants(namespace, {("kopf.dev", "kopfpeerings"): PEERING_VERBS})
    assert rendered_grants(docs) == expected


def test_standalone_mode_has_no_peering_grants(helm: Path) -> None:
    docs = documents(render(helm, [VALUES_DIR / "standalone.yaml"]))
    assert rendered_grants(docs) == grants("*", NAMESPACED_NEEDS) | grants("*", CLUSTER_NEEDS)


def test_rbac_create_false_renders_no_rbac(helm: Path) -> None:
    docs = documents(render(helm, sets=["rbac.create=false"]))
    assert not [doc for doc in docs if doc["apiVersion"].startswith("rbac.authorization.k8s.io/")]
