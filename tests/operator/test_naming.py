"""The name rules against what render.py derives: the longest allowed name gives valid children."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from pd_operator import goodput, layout, naming, render
from pd_operator.commands.render import objects_for
from pd_operator.crd import spec_schema
from pd_operator.validation import validate_spec
from tests.operator.conftest import DRA, EXAMPLES, load_example

# Kubernetes' own limits (k8s.io/apimachinery/pkg/util/validation): DNS-1123 subdomain, label value.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LONGEST = "q" + "-x" * 31  # 63 characters, ends with a letter


def _label_values_ok(labels: dict[str, str]) -> bool:
    return all(len(v) <= 63 and _LABEL_VALUE.match(v) for v in labels.values())


def _check_object(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    name = meta["name"]
    assert len(name) <= 253 and _SUBDOMAIN.match(name), name
    if obj["kind"] in ("Service", "Job"):  # a Job's name is also the value of its pods' job-name label
        assert len(name) <= 63 and _DNS_1035.match(name), f"{obj['kind']} {name}"
    assert _label_values_ok(meta["labels"]), meta["labels"]
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    assert _label_values_ok(template.get("labels", {})), template


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
@pytest.mark.parametrize("strategy", ["devicePlugin", "dra"])
def test_longest_valid_name_gives_valid_children(path: Any, strategy: str) -> None:
    assert len(LONGEST) == naming.MAX_NAME_LENGTH and naming.name_problems(LONGEST) == []
    raw = load_example(path.name)["spec"]
    if strategy == "dra":
        raw = {**raw, "engine": "simulated", "simulation": {"reserveGpus": True}, "gpuAllocation": DRA}
    spec = validate_spec(raw)
    lay = layout.build(layout.Owner(name=LONGEST, namespace="a" * 63, uid="u"), spec)
    job = render.probe_job(lay, goodput.job_name(LONGEST, datetime(2026, 12, 1, tzinfo=UTC)))
    objects = [*render.children(lay).all, job]
    assert strategy != "dra" or any(o["kind"] == "ResourceClaimTemplate" for o in objects)
    for obj in objects:
        _check_object(obj)


@pytest.mark.parametrize(
    ("name", "broken"),
    [
        ("q" * 64, [0]),
        ("Qwen", [1]),
        ("qwen-", [1]),
        ("-qwen", [1]),
        ("qwen_3", [1]),
        ("Q" * 64, [0, 1]),
    ],
)
def test_name_problems_name_the_broken_rules(name: str, broken: list[int]) -> None:
    assert naming.name_problems(name) == [f"metadata.name: {naming.NAME_RULES[i].message}" for i in broken]


def test_crd_puts_the_rules_on_metadata_name() -> None:
    name = spec_schema()["properties"]["metadata"]["properties"]["name"]
    assert [r["rule"] for r in name["x-kubernetes-validations"]] == [r.cel for r in naming.NAME_RULES]


def test_pdctl_render_gives_the_longest_name_a_valid_probe_job() -> None:
    doc = load_example("simulated-write.yaml")
    doc["metadata"]["name"] = LONGEST
    doc["spec"]["goodputProbe"] = {"enabled": True}
    [job] = [o for o in objects_for(doc, "ns") if o["kind"] == "Job"]
    _check_object(job)
