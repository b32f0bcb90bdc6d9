"""spec.engineVersion end to end: the status shows the vLLM release each engine runs, and an engine of
another release than the declared one is refused by its launcher's preflight, both releases named.

Simulated engines stand in for images: a simulated engine runs the release in its PD_SIM_VLLM_VERSION,
which the operator sets to spec.engineVersion and an `env` entry of the spec replaces (an image of another
release). Both deployments fit one node: four simulated GPUs each.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from e2e.cluster import REPO_ROOT, ControlPlane
from e2e.stack import Stack
from e2e.tests.kube import Obj, applied_in, condition, pdd, wait_for, wait_pdd_ready

NAMESPACE = "pd-engine-version"
DECLARED = "0.33.0"
IMAGE_RUNS = "0.32.0"


def deployment(name: str, prefill_env: list[Obj]) -> Obj:
    obj: Obj = yaml.safe_load((REPO_ROOT / "examples" / "simulated-write.yaml").read_text())
    obj["metadata"]["name"] = name
    spec = obj["spec"]
    spec["engineVersion"] = DECLARED
    spec["goodputProbe"]["enabled"] = False
    spec["prefill"] |= {"gpus": "0-1", "tensorParallelSize": 2, "env": prefill_env}
    spec["decode"] |= {"gpus": "2-3", "tensorParallelSize": 2}
    return obj


@pytest.fixture(scope="module")
def namespace(operator: Stack) -> Iterator[str]:
    other_image = [{"name": "PD_SIM_VLLM_VERSION", "value": IMAGE_RUNS}]
    objs = [deployment("declared", []), deployment("mismatched", other_image)]
    with applied_in(operator.cp, NAMESPACE, objs) as namespace:
        yield namespace


def test_the_status_shows_the_release_each_engine_runs(cp: ControlPlane, namespace: str) -> None:
    wait_pdd_ready(cp, namespace, "declared", timeout_s=180)

    def shown() -> Obj | None:
        status = (pdd(cp, namespace, "declared") or {}).get("status") or {}
        return status if status.get("engineVersion") else None

    status = wait_for(shown, 60, "status.engineVersion")
    assert status["engineVersion"] == DECLARED
    engines = {r["name"]: r.get("engineVersion") for r in status["roles"] if r["role"] != "proxy"}
    assert engines == {"prefill": DECLARED, "decode": DECLARED}
    header, row = cp.kubectl("get", "pdd", "declared", "-n", namespace, "-o", "wide").splitlines()
    assert "VLLM" in header.split() and DECLARED in row.split(), (header, row)


def test_an_engine_of_another_release_is_refused_by_preflight_naming_both(cp: ControlPlane, namespace: str) -> None:
    def refused() -> Obj | None:
        found = condition(pdd(cp, namespace, "mismatched"), "PrefillReady") or {}
        return found if found.get("reason") == "PreflightFailed" else None

    prefill = wait_for(refused, 120, "PrefillReady reason PreflightFailed")
    assert prefill["status"] == "False"
    message = prefill["message"]
    assert f"declares vLLM {DECLARED}" in message and f"runs vLLM {IMAGE_RUNS}" in message, message
    decode = condition(pdd(cp, namespace, "mismatched"), "DecodeReady") or {}
    assert decode.get("reason") != "PreflightFailed", decode  # decode runs the declared release
