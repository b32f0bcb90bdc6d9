"""`pdctl plan` end to end on the simulator: the seed's workload at 8 req/s and a light one at 0.5 req/s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator.commands.render import objects_for
from pd_operator.policy import TenancyPolicy
from pd_runtime.plan.cli import main
from tests.plan.conftest import plan

ISSUE_LAYOUTS = {"1xTP8", "2xTP4", "4xTP2", "1P TP4 + 1D TP4", "2P TP2 + 1D TP4", "1P TP4 + 2D TP2"}


def test_seed_workload_prices_every_layout_and_ranks_disaggregated_first(
    seed_plan: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, doc = seed_plan
    priced = {row["layout"] for row in doc["layouts"]}
    assert priced >= ISSUE_LAYOUTS
    assert all(row["tp"] == 1 for row in doc["excluded"])  # only TP1 engines cannot hold the weights
    assert doc["layouts"][0]["kind"] == "disaggregated"
    assert doc["verdict"]["text"].startswith("disaggregate: write mode, ")
    assert doc["verdict"]["text"].endswith(" (predicted)") == doc["layouts"][0]["predicted"]
    colocated = [row for row in doc["layouts"] if row["kind"] == "colocated"]
    assert all(row["itlMisses"] > row["ttftMisses"] for row in colocated)
    for row in doc["layouts"]:
        low, high = row["attainmentInterval"]
        assert low <= row["attainment"] <= high
        assert len(row["attainmentRuns"]) == 2
        assert min(row["attainmentRuns"]) <= row["attainment"] <= max(row["attainmentRuns"])
        assert row["predicted"] == ("TP2" in row["layout"])


def test_emitted_yaml_is_the_best_layout_the_api_runs_and_renders(seed_plan: tuple[Path, dict[str, Any]]) -> None:
    tmp, doc = seed_plan
    emitted = doc["emitted"]
    ranked = [row["layout"] for row in doc["layouts"]]
    assert emitted["layout"] in ranked
    if emitted["layout"] != ranked[0]:
        assert "more colocated engines" in emitted["note"]
    assert emitted["layout"] == ranked[0] or ranked[0] == "4xTP2"  # xPyD layouts are expressible
    manifest = yaml.safe_load((tmp / "best.yaml").read_text())
    opt_in = TenancyPolicy(allow_host_network=True)  # an RDMA layout shares the node's network (docs/security.md)
    assert any(o["kind"] == "Pod" for o in objects_for(manifest, None, opt_in))


def test_light_load_with_short_prompts_stays_colocated(tmp_path: Path) -> None:
    doc = plan(tmp_path, 0.5, 200)
    assert doc["layouts"][0]["kind"] == "colocated"
    assert doc["verdict"]["text"].startswith("stay colocated: ")
    # the image's vLLM 0.31 writes KV only between equal TP sizes: no layout changes TP
    assert "1P TP4 + 1D TP4" in {row["layout"] for row in doc["layouts"]}
    assert not {row["layout"] for row in doc["layouts"]} & {"2P TP2 + 1D TP4", "1P TP4 + 2D TP2"}


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--model", "nope", "--prompt-tokens", "1", "--output-tokens", "1", "--rate", "1",
              "--slo-ttft-ms", "1", "--slo-itl-ms", "1"])  # fmt: skip
    assert exc.value.code == 2
    assert "--model 'nope'" in capsys.readouterr().err


def _mixed(tmp: Path, *extra: str) -> dict[str, Any]:
    argv = ["--model", "Qwen/Qwen3-235B-A22B-FP8", "--prompt-mix", "200:0.7,2000:0.3", "--output-tokens", "200",
            "--rate", "2", "--slo-ttft-ms", "300", "--slo-itl-ms", "100", "--rates", "2:2:1", "--seeds", "1",
            "--requests", "40", "--output", str(tmp / "plan.json"), "--quiet", *extra]  # fmt: skip
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads((tmp / "plan.json").read_text())
    return doc


def test_a_mixed_workload_is_priced_with_and_without_the_disaggregation_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    always = _mixed(tmp_path)
    assert always["inputs"]["prompt_tokens"] == 2000  # the longest prompt, which the memory fit takes
    threshold = _mixed(tmp_path, "--disaggregation-threshold", "512")
    assert threshold["inputs"]["decode_alone_below"] == 512
    assert "mixed 0.7 x 200, 0.3 x 2000 prompt" in capsys.readouterr().out
    by_layout = {row["layout"]: row for row in threshold["layouts"]}
    for row in always["layouts"]:  # colocated layouts have no prefill to skip; disaggregated ones change
        assert (by_layout[row["layout"]]["ttftMs"] == row["ttftMs"]) == (row["kind"] == "colocated")


@pytest.mark.parametrize("mix", ["200", "200:0", "a:1", "200:0.5,x"])
def test_a_malformed_prompt_mix_is_a_usage_error(mix: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--model", "Qwen/Qwen3-235B-A22B-FP8", "--prompt-mix", mix, "--output-tokens", "1", "--rate", "1",
              "--slo-ttft-ms", "1", "--slo-itl-ms", "1"])  # fmt: skip
    assert exc.value.code == 2
