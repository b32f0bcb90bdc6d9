"""The emitted PDDeployment is what the operator's own API and renderer accept."""

from __future__ import annotations

import pytest
import yaml

from pd_operator.commands.render import objects_for
from pd_operator.policy import TenancyPolicy
from pd_runtime.plan.emit import manifest, supported, to_yaml
from pd_runtime.plan.layouts import NodeLayout, layouts
from pd_runtime.plan.price import Demand

DEMAND = Demand(rate=8, rates=(8.0,), prompt_tokens=2000, output_tokens=1000, ttft_slo_s=1.0, itl_slo_s=0.05)
MODEL = "Qwen/Qwen3-235B-A22B-FP8"
EXPRESSIBLE = [
    layout for layout in layouts(8) if supported(layout) and 1 not in (layout.prefill_tp, layout.decode_tp)
] + [NodeLayout("disaggregated", 1, 4, 1, 4, backend="xgmi")]


@pytest.mark.parametrize("layout", EXPRESSIBLE, ids=lambda layout: f"{layout.name} {layout.backend}")
def test_expressible_layouts_render(layout: NodeLayout) -> None:
    doc = yaml.safe_load(to_yaml(manifest(layout, MODEL, DEMAND, vllm_version="0.34.0")))
    assert doc == manifest(layout, MODEL, DEMAND, vllm_version="0.34.0")  # the YAML writer round-trips
    # hostDevices for XGMI, the host network for RDMA (docs/security.md)
    tenancy = TenancyPolicy(allow_privileged=layout.backend == "xgmi", allow_host_network=layout.backend == "rdma")
    pod = next(o for o in objects_for(doc, None, tenancy) if o["kind"] == "Pod")
    engines = [c["command"] for c in pod["spec"]["containers"] if "serve" in c["command"]]
    tps = sorted(int(args[args.index("-tp") + 1]) for args in engines)
    expected = (
        [layout.engine_tp] * layout.engines
        if layout.kind == "colocated"
        else [layout.prefill_tp] * layout.prefills + [layout.decode_tp] * layout.decodes
    )
    assert tps == sorted(expected)


def test_every_feasible_layout_but_four_colocated_engines_is_expressible() -> None:
    expressible = {layout.name for layout in layouts(8) if supported(layout)}
    assert {"1xTP8", "2xTP4", "1P TP4 + 1D TP4", "2P TP2 + 1D TP4", "1P TP4 + 2D TP2", "2P TP2 + 2D TP2"} <= expressible
    assert "4xTP2" not in expressible
    with pytest.raises(ValueError, match="4 colocated engines"):
        manifest(NodeLayout("colocated", engines=4, engine_tp=2), MODEL, DEMAND)


def test_xpyd_instances_get_disjoint_gpus_and_ports() -> None:
    spec = manifest(NodeLayout("disaggregated", 2, 2, 1, 4), MODEL, DEMAND)["spec"]
    assert [i["gpus"] for i in spec["prefill"]["instances"]] == ["0-1", "2-3"]
    assert [i["ports"]["handshake"] for i in spec["prefill"]["instances"]] == [6301, 6311]
    assert spec["decode"]["gpus"] == "4-7" and "instances" not in spec["decode"]


def test_manifest_carries_the_layout_and_the_workload() -> None:
    spec = manifest(NodeLayout("disaggregated", 1, 4, 1, 4), MODEL, DEMAND)["spec"]
    assert (spec["prefill"]["gpus"], spec["decode"]["gpus"]) == ("0-3", "4-7")
    assert spec["kvTransfer"]["transferMode"] == "write"
    assert spec["goodputProbe"]["slo"] == {"ttftMs": 1000, "itlMs": 50}
    engines = manifest(NodeLayout("colocated", engines=1, engine_tp=8), MODEL, DEMAND)["spec"]["colocated"]["engines"]
    assert [(e["gpus"], e["tensorParallelSize"]) for e in engines] == [("0-7", 8)]


def test_a_layout_that_changes_tp_declares_the_vllm_it_was_planned_for() -> None:
    """Write mode between TP sizes needs vLLM 0.33; admission refuses it for the image's 0.31 otherwise."""
    mixed = manifest(NodeLayout("disaggregated", 2, 2, 1, 4), MODEL, DEMAND, vllm_version="0.34.0")["spec"]
    assert mixed["engineVersion"] == "0.34.0"
    assert "engineVersion" not in manifest(NodeLayout("disaggregated", 1, 4, 1, 4), MODEL, DEMAND)["spec"]


def test_before_vllm_0_33_no_layout_changes_tp_between_prefill_and_decode() -> None:
    names = {layout.name for layout in layouts(8, mixed_tp=False)}
    assert "1P TP4 + 1D TP4" in names and "2P TP2 + 2D TP2" in names
    assert not {"2P TP2 + 1D TP4", "1P TP4 + 2D TP2"} & names
