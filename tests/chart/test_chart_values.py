"""What the operator Deployment must be whatever the values (hardening, probes, peering), and what
values.schema.json rejects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pd_operator import render as render_module
from pd_operator.commands.operator import build_parser
from tests.chart.chart_helpers import VALUES_DIR, documents, find, render, run_helm, template_args


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def flag(args: list[str], name: str) -> list[str]:
    return [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{name}=")]


@pytest.mark.parametrize("values", [[], *[[path] for path in sorted(VALUES_DIR.glob("*.yaml"))]], ids=str)
def test_operator_container_is_hardened(helm: Path, values: list[Path]) -> None:
    docs = documents(render(helm, values))
    (deployment,) = find(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    security = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]}


def test_liveness_probe_targets_the_operators_liveness_port(helm: Path) -> None:
    container = operator_container(documents(render(helm, sets=["liveness.port=18080"])))
    assert container["command"] == ["pdctl", "operator"]
    assert flag(container["args"], "--liveness-port") == ["18080"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["health"] == 18080
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize("sets", [[], ["nameOverride=inference-operator"], ["fullnameOverride=ops"]])
def test_operator_pods_carry_the_label_pddeployment_network_policies_admit(helm: Path, sets: list[str]) -> None:
    """Whatever the chart's names, the operator's pods match the serving pods' NetworkPolicy peer."""
    (deployment,) = find(documents(render(helm, sets=sets)), "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert render_module.OPERATOR_POD_LABELS.items() <= labels.items()
    # and tell the operator its namespace, the one the peer pins (pdctl operator --operator-namespace)
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_peering_names_the_rendered_peering_object(helm: Path) -> None:
    docs = documents(render(helm, [VALUES_DIR / "ha-monitoring.yaml"]))
    container = operator_container(docs)
    (peering,) = find(docs, "ClusterKopfPeering")
    assert flag(container["args"], "--peering") == [peering["metadata"]["name"]]
    assert "--all-namespaces" in container["args"]
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert find(docs, "Deployment")[0]["spec"]["replicas"] == 2


def test_namespaced_mode_passes_each_namespace(helm: Path) -> None:
    docs = documents(render(helm, [VALUES_DIR / "namespaced.yaml"]))
    args = operator_container(docs)["args"]
    assert flag(args, "--namespace") == ["team-a", "team-b"]
    assert "--all-namespaces" not in args
    assert sorted(doc["metadata"]["namespace"] for doc in find(docs, "KopfPeering")) == ["team-a", "team-b"]


def test_service_monitor_scrapes_the_metrics_service(helm: Path) -> None:
    docs = documents(render(helm, [VALUES_DIR / "ha-monitoring.yaml"]))
    (monitor,) = find(docs, "ServiceMonitor")
    (service,) = find(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    image = operator_container(docs)["image"]
    assert image == "registry.example.com/pd-operator@sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["peering.enabled=false", "replicaCount=2"], "replicaCount"),
        (["metrics.enabled=false", "metrics.serviceMonitor.enabled=true"], "metrics"),
        (["image.digest=latest"], "digest"),
        (["watchNamespaces={Team_A}"], "watchNamespaces"),
        (["liveness.port=0"], "liveness"),
        (["replicas=2"], "replicas"),
    ],
)
def test_schema_rejects_bad_values(helm: Path, sets: list[str], message: str) -> None:
    result = run_helm(helm, template_args(sets=sets))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("values", [[], *[[path] for path in sorted(VALUES_DIR.glob("*.yaml"))]], ids=str)
def test_pdctl_operator_accepts_the_rendered_arguments(helm: Path, values: list[Path]) -> None:
    container = operator_container(documents(render(helm, values)))
    args = build_parser().parse_args(container["args"])
    assert args.liveness_port == int(flag(container["args"], "--liveness-port")[0])
