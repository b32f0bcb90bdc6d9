"""Pure: an API server's refusal of a child write -> which policy refused it and which fields are at fault.

The API server answers a refused create or apply with a ``Status`` object whose ``message`` says who
refused (RBAC, an admission plugin such as PodSecurity or OwnerReferencesPermissionEnforcement, a
quota, a webhook, schema validation) in a wording each of them keeps stable, and, for ``Invalid``, a
list of ``details.causes`` naming the fields. A user needs exactly that to act, so the condition and
the Event say it in one line (``describe``) instead of the raw JSON; the message itself stays in
``detail`` for anything not recognised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_operator.conditions import NAME_CONFLICT, RefusalReason

DETAIL_LIMIT = 1024
_POD_SECURITY = re.compile(r'violates PodSecurity "(?P<level>[^"]+)": (?P<checks>.*)$', re.S)
_RBAC = re.compile(r'User "(?P<user>[^"]+)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)"')
_WEBHOOK = re.compile(r'admission webhook "(?P<name>[^"]+)" denied the request: (?P<why>.*)$', re.S)
# A write to an API nobody serves: kube-apiserver's mux answers an unknown group's path with Go's plain-text
# "404 page not found"; a known group without that resource gets a NotFound Status with the second wording.
_NOT_SERVED = ("404 page not found", "the server could not find the requested resource")
_ADMISSION_POLICY = re.compile(r"ValidatingAdmissionPolicy '(?P<name>[^']+)'.* denied request: (?P<why>.*)$", re.S)


@dataclass(frozen=True)
class ApiFailure:
    """A failed API call as the server described it (its ``Status``), or a transport error (code 0)."""

    code: int
    reason: str = ""  # Status.reason: Forbidden, Invalid, AlreadyExists, ...
    message: str = ""
    causes: tuple[tuple[str, str], ...] = ()  # (field, message) of Status.details.causes

    def __str__(self) -> str:
        return f"HTTP {self.code}: {self.message or self.reason}"


def failure_from_status(code: int, body: Any) -> ApiFailure:
    """An :class:`ApiFailure` from the HTTP status and the response body (a Status object, or not)."""
    if not isinstance(body, Mapping) or body.get("kind") != "Status":
        return ApiFailure(code, message=str(body or "")[:DETAIL_LIMIT])
    details = body.get("details") or {}
    causes = tuple(
        (str(c.get("field", "")), str(c.get("message", ""))) for c in details.get("causes") or [] if isinstance(c, dict)
    )
    return ApiFailure(code, str(body.get("reason", "")), str(body.get("message", "")), causes)


@dataclass(frozen=True)
class Refusal:
    """Who refused which child, and what the user has to change."""

    obj: str  # e.g. Pod/qwen
    reason: RefusalReason  # ChildrenAdmitted's reason: PodSecurity, OwnerReferencesPermission, RBAC, Invalid, ...
    policy: str  # e.g. PodSecurity "baseline:latest"
    fields: tuple[str, ...]  # what is at fault, as the policy words it
    detail: str  # the server's own message

    def describe(self) -> str:
        at_fault = "; ".join(self.fields) if self.fields else self.detail
        return f"{self.obj} refused by {self.policy}: {at_fault}"[:DETAIL_LIMIT]


def _top_level_items(text: str) -> tuple[str, ...]:
    """Split "a (x, y), b (z)" at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return tuple(item for item in items if item)


def _forbidden(obj: str, message: str) -> Refusal:
    if found := _POD_SECURITY.search(message):
        level = found["level"]
        return Refusal(obj, "PodSecurity", f'PodSecurity "{level}"', _top_level_items(found["checks"]), message)
    if "blockOwnerDeletion" in message or "ownerRef" in message:
        fields = ("metadata.ownerReferences[].blockOwnerDeletion (needs update on pddeployments/finalizers)",)
        return Refusal(obj, "OwnerReferencesPermission", "OwnerReferencesPermissionEnforcement", fields, message)
    if found := _RBAC.search(message):
        who = f"{found['user']} may not {found['verb']} {found['resource']}"
        return Refusal(obj, "RBAC", "RBAC", (who,), message)
    if "exceeded quota" in message:
        return Refusal(obj, "ResourceQuota", "ResourceQuota", (message.split("exceeded quota: ", 1)[1],), message)
    if found := _WEBHOOK.search(message):
        return Refusal(obj, "AdmissionWebhook", f'admission webhook "{found["name"]}"', (found["why"],), message)
    if found := _ADMISSION_POLICY.search(message):
        policy = f"ValidatingAdmissionPolicy {found['name']}"
        return Refusal(obj, "AdmissionPolicy", policy, (found["why"],), message)
    return Refusal(obj, "Forbidden", "admission", (), message)


def refusal(obj: str, failure: ApiFailure) -> Refusal:
    """What the refusal of ``obj`` (``Kind/name``) means, from the API server's answer."""
    message = failure.message.strip()
    if failure.code == 403:
        return _forbidden(obj, message)
    if failure.code == 422 and any(field == "metadata.uid" for field, _ in failure.causes):
        # the apply named the uid the operator last saw (a precondition): someone replaced the object
        why = "replaced by another object since the operator applied it; it is read again on the next repair"
        return Refusal(obj, NAME_CONFLICT, "a name conflict", (why,), message)
    if failure.code == 409 and "uid mismatch" in message:
        # an apply naming the uid the operator last saw found no object of that name: deleted meanwhile
        why = "deleted since the operator applied it; it is created again on the next repair"
        return Refusal(obj, "ChildDeleted", "the uid precondition", (why,), message)
    if failure.code == 422:
        fields = tuple(f"{field}: {why}" if field else why for field, why in failure.causes) or (message,)
        return Refusal(obj, "Invalid", "API validation", fields, message)
    if failure.code == 404 and any(words in message for words in _NOT_SERVED):  # e.g. a CRD not installed
        kind = obj.partition("/")[0]
        return Refusal(obj, "NotServed", "the API server", (f"no {kind} API is served: install its CRD",), message)
    return Refusal(obj, "APIError", f"the API server (HTTP {failure.code})", (), str(failure))
