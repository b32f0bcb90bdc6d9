"""refusals.py: the API server's refusal messages (as Kubernetes words them) -> policy and fields."""

from __future__ import annotations

import pytest

from pd_operator.refusals import ApiFailure, failure_from_status, refusal

# Wordings of kube-apiserver 1.34: pod-security-admission, plugin/pkg/admission/gc, the RBAC authorizer,
# the quota and webhook admission plugins.
CASES = [
    (
        'pods "qwen" is forbidden: violates PodSecurity "baseline:latest": privileged (containers "prefill", '
        '"decode" must not set securityContext.privileged=true), seccompProfile (pod or containers "prefill", '
        '"decode" must not set securityContext.seccompProfile.type to "Unconfined")',
        "PodSecurity",
        'PodSecurity "baseline:latest"',
        (
            'privileged (containers "prefill", "decode" must not set securityContext.privileged=true)',
            'seccompProfile (pod or containers "prefill", "decode" must not set securityContext.seccompProfile.type '
            'to "Unconfined")',
        ),
    ),
    (
        'services "qwen" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you '
        "can't set finalizers on: , <nil>",
        "OwnerReferencesPermission",
        "OwnerReferencesPermissionEnforcement",
        ("metadata.ownerReferences[].blockOwnerDeletion (needs update on pddeployments/finalizers)",),
    ),
    (
        'jobs.batch is forbidden: User "system:serviceaccount:pd-system:pd" cannot create resource "jobs" in API '
        'group "batch" in the namespace "team-a"',
        "RBAC",
        "RBAC",
        ("system:serviceaccount:pd-system:pd may not create jobs",),
    ),
    (
        'pods "qwen" is forbidden: exceeded quota: compute, requested: requests.memory=96Gi, used: '
        "requests.memory=0, limited: requests.memory=64Gi",
        "ResourceQuota",
        "ResourceQuota",
        ("compute, requested: requests.memory=96Gi, used: requests.memory=0, limited: requests.memory=64Gi",),
    ),
    (
        'admission webhook "validate.kyverno.svc-fail" denied the request: policy Pod/team-a/qwen for resource '
        "violation: require-labels",
        "AdmissionWebhook",
        'admission webhook "validate.kyverno.svc-fail"',
        ("policy Pod/team-a/qwen for resource violation: require-labels",),
    ),
]


@pytest.mark.parametrize(("message", "reason", "policy", "fields"), CASES)
def test_forbidden_names_the_policy_and_fields(message: str, reason: str, policy: str, fields: tuple[str, ...]) -> None:
    found = refusal("Pod/qwen", ApiFailure(403, "Forbidden", message))
    assert (found.reason, found.policy, found.fields) == (reason, policy, fields)
    assert found.describe() == f"Pod/qwen refused by {policy}: " + "; ".join(fields)


def test_invalid_lists_the_causes_fields() -> None:
    body = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": 'Pod "qwen" is invalid: spec.containers[0].resources.requests: Invalid value: "2": must be less '
        "than or equal to memory limit",
        "details": {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.containers[0].resources.requests",
                    "message": 'Invalid value: "2": must be less than or equal to memory limit',
                }
            ]
        },
    }
    found = refusal("Pod/qwen", failure_from_status(422, body))
    assert (found.reason, found.policy) == ("Invalid", "API validation")
    assert found.fields == (
        'spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to memory limit',
    )


def test_anything_else_keeps_the_servers_words() -> None:
    found = refusal("Pod/qwen", failure_from_status(0, "ConnectionRefusedError: [Errno 111]"))
    assert found.reason == "APIError"
    assert (
        found.describe() == "Pod/qwen refused by the API server (HTTP 0): HTTP 0: ConnectionRefusedError: [Errno 111]"
    )
    other = refusal("Pod/qwen", ApiFailure(403, "Forbidden", 'pods "qwen" is forbidden: [maximum memory usage ...]'))
    assert (other.reason, other.fields) == ("Forbidden", ())
    assert "maximum memory usage" in other.describe()
