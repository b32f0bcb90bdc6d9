"""The chart ships the generated PDDeployment CRD unchanged, except that `helm uninstall` keeps it."""

from __future__ import annotations

import yaml

from tests.chart.chart_helpers import (
    CHART_CRD,
    KEEP_ANNOTATION,
    SOURCE_CRD,
    UPDATE_ENV,
    updating,
    with_keep_annotation,
    without_keep_annotation,
    write_chart_crd,
)


def test_keep_annotation_round_trips() -> None:
    crd = {"kind": "CustomResourceDefinition", "metadata": {"name": "x", "annotations": {"a": "b"}}}
    kept = with_keep_annotation(crd)
    assert kept["metadata"]["annotations"] == {"a": "b", KEEP_ANNOTATION: "keep"}
    assert without_keep_annotation(kept) == crd


def test_chart_crd_is_the_generated_crd_with_keep_annotation() -> None:
    assert SOURCE_CRD.exists(), f"{SOURCE_CRD} is missing (generate it with `pdctl crd`)"
    if updating():
        write_chart_crd()
    assert CHART_CRD.exists(), f"{CHART_CRD} is missing; create it with {UPDATE_ENV}=1"
    chart_copy = yaml.safe_load(CHART_CRD.read_text())
    assert chart_copy["metadata"]["annotations"][KEEP_ANNOTATION] == "keep"
    assert without_keep_annotation(chart_copy) == yaml.safe_load(SOURCE_CRD.read_text()), (
        f"{CHART_CRD} drifted from {SOURCE_CRD}; refresh it with {UPDATE_ENV}=1 .venv/bin/pytest tests/chart"
    )
