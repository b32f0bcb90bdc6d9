"""`pdctl operator` flags (the run itself is exercised by the e2e suite against a real API server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_operator.commands.operator import build_parser, main


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
