"""`pdctl operator` flags (the run itself is exercised by the e2e suite against a real API server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_operator.commands.operator import NAMESPACE_ENV, build_parser, main
from pd_operator.settings import Settings


def test_namespaces_repeat_and_defaults() -> None:
    args = build_parser().parse_args(["--namespace", "a", "--namespace", "b"])
    assert args.namespace == ["a", "b"] and not args.all_namespaces
    assert (args.liveness_port, args.metrics_port, args.peering, args.standalone) == (8080, 9090, None, False)
    assert args.probe_image is None  # probes then run each PDDeployment's runtime image


def test_probe_image_is_the_operators() -> None:
    args = build_parser().parse_args(["-A", "--probe-image", "ghcr.io/pd-serving/pd-operator:0.1.0"])
    assert args.probe_image == "ghcr.io/pd-serving/pd-operator:0.1.0"


def test_cluster_wide_with_peering() -> None:
    args = build_parser().parse_args(["--all-namespaces", "--peering", "pd-operator", "--verbose"])
    assert args.all_namespaces and args.peering == "pd-operator" and args.verbose


@pytest.mark.parametrize(
    "argv",
    [[], ["--namespace", "a", "--all-namespaces"], ["-A", "--peering", "x", "--standalone"]],
)
def test_conflicting_or_missing_scope_is_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(argv)
    assert err.value.code == 2


def test_a_policy_file_that_does_not_parse_stops_the_operator_before_it_starts(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("allowPrivileged: maybe\n")
    assert main(["-A", "--policy", str(bad)]) == 2  # before kopf: nothing reconciled under a wrong policy
    assert build_parser().parse_args(["-A"]).policy is None  # the default policy


def test_the_operator_namespace_is_the_pods_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart sets POD_NAMESPACE from the downward API; the flag overrides it; offline, the README's."""
    monkeypatch.setenv(NAMESPACE_ENV, "ops")
    assert build_parser().parse_args(["-A"]).operator_namespace == "ops"
    assert build_parser().parse_args(["-A", "--operator-namespace", "x"]).operator_namespace == "x"
    monkeypatch.delenv(NAMESPACE_ENV)
    assert build_parser().parse_args(["-A"]).operator_namespace == Settings.operator_namespace == "pd-system"
