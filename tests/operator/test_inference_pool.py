"""spec.inferencePool: the Gateway API Inference Extension InferencePool over the serving pods, its
admission rule, the refusal a cluster without its CRD gives, and its removal when disabled."""

from __future__ import annotations

from typing import Any

import pytest

from pd_operator import decide, layout, render
from pd_operator.actions import Apply, Delete
from pd_operator.crd import spec_schema
from pd_operator.refusals import ApiFailure, failure_from_status, refusal
from pd_operator.snapshot import Deployment, Snapshot
from pd_operator.validation import SpecError, validate_spec
from tests.operator import test_router
from tests.operator.test_decide import T0

NS, NAME, UID = "ns1", "demo", "uid-1"
OWNER = layout.Owner(NAME, NS, UID, 1)
PICKER = {"name": "demo-epp", "port": 9002}
POOLED: dict[str, Any] = {
    "model": "m",
    "engine": "simulated",
    "inferencePool": {"enabled": True, "endpointPicker": PICKER},
}
PLAIN: dict[str, Any] = {"model": "m", "engine": "simulated"}


def applied(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    children = render.children(layout.build(OWNER, validate_spec(spec)))
    return {(o["kind"], o["metadata"]["name"]): o for o in children.applied}


def test_disabled_by_default_renders_no_pool() -> None:
    assert not [key for key in applied(PLAIN) if key[0] == "InferencePool"]
    off = {**PLAIN, "inferencePool": {"enabled": False, "endpointPicker": PICKER}}
    assert not [key for key in applied(off) if key[0] == "InferencePool"]


def test_the_pool_selects_every_serving_pod_on_the_proxy_api_port() -> None:
    spec = {**POOLED, "replicas": 3, "proxy": {"port": 8100}}
    children = render.children(layout.build(OWNER, validate_spec(spec)))
    (pool,) = [o for o in children.applied if o["kind"] == "InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["name"] == NAME and pool["metadata"]["namespace"] == NS
    (ref,) = pool["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("PDDeployment", NAME, UID, True)
    members = pool["spec"]["selector"]["matchLabels"]
    assert len(children.pods) == 3
    for pod in children.pods:  # every replica is a member ...
        assert all(pod["metadata"]["labels"].get(k) == v for k, v in members.items())
        ports = {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert 8100 in ports
    probe = render.probe_job(layout.build(OWNER, validate_spec(spec)), "demo-probe")
    labels = probe["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in members.items())  # ... and nothing else is
    assert pool["spec"]["targetPorts"] == [{"number": 8100}]


def test_the_endpoint_picker_is_the_users_service() -> None:
    (pool,) = [o for key, o in applied(POOLED).items() if key[0] == "InferencePool"]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "demo-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    spec = {**POOLED, "inferencePool": {"enabled": True, "endpointPicker": {**PICKER, "failureMode": "FailOpen"}}}
    (pool,) = [o for key, o in applied(spec).items() if key[0] == "InferencePool"]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


@pytest.mark.parametrize(
    ("pool", "wanted"),
    [
        ({"enabled": True}, "inferencePool.endpointPicker is required when inferencePool.enabled is true"),
        ({"enabled": True, "endpointPicker": {"name": "epp", "port": 0}}, "port"),
        ({"enabled": True, "endpointPicker": {"name": "", "port": 9002}}, "name"),
        ({"enabled": True, "endpointPicker": {**PICKER, "failureMode": "Retry"}}, "failureMode"),
    ],
)
def test_a_pool_without_a_usable_picker_is_refused_naming_the_field(pool: dict[str, Any], wanted: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({**PLAIN, "inferencePool": pool})
    assert wanted in str(err.value)


def test_the_crd_carries_the_same_rule_as_cel() -> None:
    (rule,) = spec_schema()["properties"]["spec"]["properties"]["inferencePool"]["x-kubernetes-validations"]
    assert rule["rule"] == "!self.enabled || has(self.endpointPicker)" and rule["fieldPath"] == ".endpointPicker"


@pytest.mark.parametrize(
    "body",
    [
        "404 page not found\n",  # what the e2e API server (1.36) answered: the group is not served at all
        {
            "kind": "Status",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
            "message": "the server could not find the requested resource",
        },  # the group served, not the resource
    ],
)
def test_a_cluster_without_the_crd_is_told_to_install_it(body: Any) -> None:
    found = refusal("InferencePool/demo", failure_from_status(404, body))
    assert (found.reason, found.fields) == ("NotServed", ("no InferencePool API is served: install its CRD",))
    expected = "InferencePool/demo refused by the API server: no InferencePool API is served: install its CRD"
    assert found.describe() == expected


def test_another_404_stays_an_api_error() -> None:
    assert refusal("Pod/demo", ApiFailure(404, "NotFound", 'namespaces "gone" not found')).reason == "APIError"


def snapshot(spec: dict[str, Any], repair: bool = True, found: str | None = None) -> Snapshot:
    """``found``: the uid of the owner of the InferencePool NAME the shell read (None: not read)."""
    seen = test_router.seen([("InferencePool", NAME)], owner_uid=found) if found else {}
    return Snapshot(Deployment(NAME, NS, UID, 1, spec, {}, {}), T0, repair_children=repair, seen=seen)


def reads(snap: Snapshot) -> list[tuple[str, str]]:
    return decide.object_reads(snap, decide.applied_children(snap))


def test_enabled_the_pool_is_applied_with_the_other_children_and_never_looked_up() -> None:
    decision = decide.decide(snapshot(POOLED))
    assert [
        a.obj["metadata"]["name"] for a in decision.actions if isinstance(a, Apply) and a.obj["kind"] == "InferencePool"
    ] == [NAME]
    assert ("InferencePool", NAME) in decide.applied_children(snapshot(POOLED))  # read as a child, not a leftover


def test_disabled_the_pool_is_looked_up_on_repairs_and_deleted_while_found() -> None:
    assert ("InferencePool", NAME) in reads(snapshot(PLAIN))
    assert reads(snapshot(PLAIN, repair=False)) == []
    assert not [a for a in decide.decide(snapshot(PLAIN)).actions if isinstance(a, Delete)]
    decision = decide.decide(snapshot(PLAIN, found=UID))
    deletes = [(a.kind, a.name, a.uid) for a in decision.actions if isinstance(a, Delete)]
    assert deletes == [("InferencePool", NAME, f"uid-InferencePool-{NAME}")]


def test_another_owners_pool_of_that_name_is_never_deleted() -> None:
    assert not [a for a in decide.decide(snapshot(PLAIN, found="another-uid")).actions if isinstance(a, Delete)]
