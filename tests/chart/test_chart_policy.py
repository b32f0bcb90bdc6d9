"""The chart's tenancy policy is policy.py's: the same defaults, schema and rules (one validation per rule,
with the rule's message), and helm renders the administrator's lists as the admission policy's variables."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from pd_operator import policy
from pd_operator.policy import DEFAULT_POLICY, RULES, TenancyPolicy
from tests.chart.chart_helpers import CHART, REPO, documents, find, render, run_helm, template_args


def test_the_chart_defaults_are_the_default_policy() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    values.pop("admission")
    assert TenancyPolicy.model_validate(values) == DEFAULT_POLICY
    assert set(values) == set(policy.KNOBS)


def test_every_rule_is_a_validation_of_the_admission_policy_with_its_message() -> None:
    template = (REPO / policy.TEMPLATE_PATH).read_text()
    assert template == policy.admission_policy_template(), "regenerate it: make generate"
    plain = re.sub(r"\{\{[^}]*\}\}", "x", "\n".join(t for t in template.splitlines() if not t.startswith("{{-")))
    vap = next(d for d in yaml.safe_load_all(plain) if d["kind"] == "ValidatingAdmissionPolicy")
    assert vap["spec"]["validations"] == [rule.validation() for rule in RULES]
    assert [v["name"] for v in vap["spec"]["variables"]] == list(policy.VARIABLES)
    for rule in RULES:
        assert f"variables.{rule.knob}" in rule.cel


def test_the_values_schema_is_the_policys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["policy"] == policy.values_schema()


def test_helm_renders_the_lists_as_cel_literals_and_the_operators_file(helm: Path) -> None:
    sets = [
        "policy.hostPaths[0].pathPrefix=/models",
        "policy.hostPaths[1].pathPrefix=/cache",
        "policy.hostPaths[1].readOnly=false",
        "policy.serviceTypes={ClusterIP,LoadBalancer}",
        "policy.podAnnotationKeys={prometheus.io/*,k8s.v1.cni.cncf.io/networks}",
    ]
    docs = documents(render(helm, sets=sets))
    (vap,) = find(docs, "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    assert json.loads(variables["hostPaths"]) == ["/models", "/cache"]  # CEL lists of one type: strings
    assert json.loads(variables["writableHostPaths"]) == ["/cache"]
    assert json.loads(variables["serviceTypes"]) == ["ClusterIP", "LoadBalancer"]
    assert json.loads(variables["podAnnotationKeys"]) == ["prometheus.io/*", "k8s.v1.cni.cncf.io/networks"]
    assert json.loads(variables["runtimeClassNames"]) == json.loads(variables["networkNamespaces"]) == []
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    config = next(d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("-policy"))
    loaded = TenancyPolicy.model_validate(yaml.safe_load(config["data"]["policy.yaml"]))
    assert loaded.service_types == ("ClusterIP", "LoadBalancer")
    assert loaded.pod_annotation_keys == ("prometheus.io/*", "k8s.v1.cni.cncf.io/networks")
    assert [(h.path_prefix, h.read_only) for h in loaded.host_paths] == [("/models", True), ("/cache", False)]
    (deployment,) = find(docs, "Deployment")
    assert (
        "--policy=/etc/pd-operator/policy/policy.yaml"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_admission_off_leaves_the_operators_check(helm: Path) -> None:
    docs = documents(render(helm, sets=["policy.admission=false"]))
    assert not find(docs, "ValidatingAdmissionPolicy") and not find(docs, "ValidatingAdmissionPolicyBinding")
    assert any(d["metadata"]["name"].endswith("-policy") for d in find(docs, "ConfigMap"))


def test_an_annotation_pattern_with_a_star_inside_is_refused_by_the_values_schema(helm: Path) -> None:
    result = run_helm(helm, template_args(sets=["policy.podAnnotationKeys={a*b}"]))
    assert result.returncode != 0 and "podAnnotationKeys" in result.stderr
