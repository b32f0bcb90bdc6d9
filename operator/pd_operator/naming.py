"""What ``metadata.name`` of a PDDeployment must be: every name and label value derived from it must fit.

From the name, render.py derives the pod, the Service and the NetworkPolicy (the name itself), the
ResourceClaimTemplate (``<name>-gpus``) and the values of the ``app.kubernetes.io/instance`` and
``pd.serving.dev/deployment`` labels on every child; goodput.py derives the probe Job name from its
first 40 characters (``<name[:40]>-goodput-<14 digits>``, 63 characters). The tightest of these are the
Service name (a DNS-1035 label: at most 63 characters, lowercase alphanumerics and '-', starting with
a letter) and the label values (at most 63 characters). Container port names do not derive from the
name. The API server checks the CEL spelling (on ``metadata.name`` in the CRD), ``pdctl render`` the
Python one, with the same message.
"""

from __future__ import annotations

import re

from pd_operator.rules import Rule

MAX_NAME_LENGTH = 63
DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The API server's own bound on object names (a DNS-1123 subdomain); it also bounds the CEL cost.
API_NAME_MAX_LENGTH = 253
_DNS_1035_RE = re.compile(DNS_1035_LABEL)

NAME_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"self.size() <= {MAX_NAME_LENGTH}",
        message=(
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters: it is the Service name and the value "
            "of the app.kubernetes.io/instance and pd.serving.dev/deployment labels"
        ),
        check=lambda name: len(name) <= MAX_NAME_LENGTH,
    ),
    Rule(
        cel=f"self.matches('{DNS_1035_LABEL}')",
        message=(
            "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter "
            "and ending with a letter or digit): it is the Service name"
        ),
        check=lambda name: bool(_DNS_1035_RE.match(name)),
    ),
)


def name_schema() -> dict[str, object]:
    """The CRD schema of ``metadata``: Kubernetes allows restrictions there on name and generateName only."""
    name = {
        "type": "string",
        "description": "Name of the PDDeployment, its pod, Service and NetworkPolicy: a DNS-1035 label.",
        "maxLength": API_NAME_MAX_LENGTH,
        "x-kubernetes-validations": [rule.crd_entry() for rule in NAME_RULES],
    }
    # generateName stays unrestricted (the generated name meets the rules on name); declaring it keeps
    # the API server's CEL cost estimate on this schema, where name is bounded, instead of a bare one.
    generate_name = {"type": "string", "maxLength": API_NAME_MAX_LENGTH, "description": "Prefix of a generated name."}
    return {"type": "object", "properties": {"name": name, "generateName": generate_name}}


def name_problems(name: str) -> list[str]:
    """``"metadata.name: <message>"`` for each rule the name breaks, as the API server words them."""
    return [f"metadata.name: {rule.message}" for rule in NAME_RULES if not rule.check(name)]
