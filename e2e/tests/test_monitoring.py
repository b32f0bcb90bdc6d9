"""The chart's monitoring objects on the real API server, with the Prometheus Operator's own CRDs.

The CRDs come from the prometheus-operator Go module at the version e2e/fetch-crds.sh pins.
Server-side dry runs are enough: what is checked is that the API server accepts the objects the chart
renders, under the CRDs' schemas.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import CHART, OPERATOR_NAMESPACE, RELEASE, Stack

FETCH_SCRIPT = REPO_ROOT / "e2e" / "fetch-crds.sh"
CRD_FILES = ("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_servicemonitors.yaml")
MONITORING_VALUES = ("metrics.podMonitor.enabled", "metrics.serviceMonitor.enabled", "metrics.grafanaDashboard.enabled")


@pytest.fixture(scope="module")
def monitoring_crds(operator: Stack) -> ControlPlane:
    out = subprocess.run(
        ["bash", str(FETCH_SCRIPT), "prometheus"], check=True, capture_output=True, text=True, timeout=600
    )
    crd_dir = Path(out.stdout.strip().splitlines()[-1])
    cp = operator.cp
    for name in CRD_FILES:
        cp.kubectl("apply", "--server-side", "-f", str(crd_dir / name))
    for name in ("podmonitors", "servicemonitors"):
        cp.kubectl("wait", "--for=condition=Established", f"crd/{name}.monitoring.coreos.com", "--timeout=60s")
    return cp


@pytest.fixture(scope="module")
def rendered(operator: Stack) -> list[dict[str, Any]]:
    sets = [arg for key in MONITORING_VALUES for arg in ("--set", f"{key}=true")]
    with operator.cp.http() as client:  # helm template assumes an old Kubernetes unless told the server's
        version = client.get("/version").json()["gitVersion"]
    args = ["template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--kube-version", version]
    text = operator.helm(*args, *sets)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _dry_run(cp: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cp.tool("kubectl"), "apply", "--dry-run=server", "-f", "-"],
        env=cp.env(),
        input=yaml.safe_dump(obj),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(RELEASE)]
    return found


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_rendered_monitor_is_accepted_under_the_prometheus_operator_crd(
    monitoring_crds: ControlPlane, rendered: list[dict[str, Any]], kind: str
) -> None:
    result = _dry_run(monitoring_crds, _one(rendered, kind))
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout


def test_the_crd_schema_is_enforced(monitoring_crds: ControlPlane, rendered: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(_one(rendered, "PodMonitor"))
    broken["spec"]["podMetricsEndpoints"][0]["interval"] = "every minute"
    result = _dry_run(monitoring_crds, broken)
    assert result.returncode != 0 and "interval" in result.stderr, result.stdout + result.stderr


def test_dashboard_config_map_is_accepted(operator: Stack, rendered: list[dict[str, Any]]) -> None:
    config_map = next(d for d in rendered if d["kind"] == "ConfigMap" and "pd-serving.json" in d.get("data", {}))
    result = _dry_run(operator.cp, config_map)
    assert result.returncode == 0, result.stderr
