"""e2e/metrics_api.py, the suite's external metrics API: the rule it serves the operator's gauges by, and
that only the API server's front proxy gets an answer (the e2e HPA test runs it for real)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from e2e import metrics_api

EXPOSITION = """\
# HELP pd_operator_desired_replicas Replicas spec.autoscaling asks for
# TYPE pd_operator_desired_replicas gauge
pd_operator_desired_replicas{name="sim-write",namespace="serving"} 3.0
pd_operator_desired_replicas{name="other",namespace="serving"} 1.0
pd_operator_desired_replicas{name="sim-write",namespace="elsewhere"} 2.0
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""


def test_the_namespace_label_is_the_requests_namespace_and_the_selector_matches_the_rest() -> None:
    series = metrics_api.samples(EXPOSITION)
    assert list(series) == ["pd_operator_desired_replicas"]  # the operator's own metrics only
    found = metrics_api.value_list(
        "pd_operator_desired_replicas", series["pd_operator_desired_replicas"], "serving", "name=sim-write"
    )
    assert found["kind"] == "ExternalMetricValueList" and found["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    assert [(i["metricLabels"]["name"], i["value"]) for i in found["items"]] == [("sim-write", "3000m")]
    everyone = metrics_api.value_list(
        "pd_operator_desired_replicas", series["pd_operator_desired_replicas"], "serving", ""
    )
    assert len(everyone["items"]) == 2


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("name=a", True), ("name==a", True), ("name!=a", False), ("name=a,tier=x", False), ("", True), ("name=b", False)],
)
def test_equality_selectors(selector: str, expected: bool) -> None:
    assert metrics_api.matches(selector, {"name": "a"}) is expected


@pytest.mark.parametrize("selector", ["name in (a,b)", "!name", "name", "=a"])
def test_set_based_selectors_are_refused(selector: str) -> None:
    with pytest.raises(metrics_api.SelectorError):
        metrics_api.matches(selector, {"name": "a"})


async def test_a_caller_without_the_front_proxy_certificate_is_refused() -> None:
    async with TestClient(TestServer(metrics_api.app("http://127.0.0.1:9/metrics"))) as client:
        resp = await client.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/pd_operator_desired_replicas")
        assert resp.status == 403 and (await resp.json())["reason"] == "Forbidden"
