"""Pure preflight rules: each observed situation gives the expected verdict, without touching the host."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pd_runtime.preflight import (
    EngineNeeds,
    GpuPartition,
    HostFacts,
    effective_min_shm_mib,
    failure_message,
    preflight,
)

GIB = 1024**3
FOUR_RENDER_NODES = ("renderD128", "renderD136", "renderD144", "renderD152")
EIGHT_RENDER_NODES = tuple(f"renderD{128 + 8 * i}" for i in range(8))
PREFILL = EngineNeeds(role="prefill", gpus=4, backend="rdma", ports=(20005, 6301, 6105), min_shm_mib=1024)
SIMULATED = EngineNeeds(role="decode", gpus=0, backend="none", ports=(40005,), min_shm_mib=0)
# A device-plugin container on a healthy MI300X node with an RDMA NIC: four GPUs, renumbered 0..3.
HEALTHY = HostFacts(
    kfd_present=True,
    render_nodes=FOUR_RENDER_NODES,
    kfd_gpu_nodes=4,
    partitions=tuple(GpuPartition(node, "SPX", "NPS1") for node in FOUR_RENDER_NODES),
    shm_bytes=32 * GIB,
    rdma_devices=("mlx5_0",),
    uverbs_nodes=("uverbs0",),
)


def test_healthy_device_plugin_container_passes() -> None:
    assert preflight(PREFILL, HEALTHY) == []


def test_host_devices_container_with_exact_visible_devices_passes() -> None:
    facts = replace(
        HEALTHY,
        render_nodes=EIGHT_RENDER_NODES,
        kfd_gpu_nodes=8,
        visible_devices={"HIP_VISIBLE_DEVICES": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    )
    assert preflight(PREFILL, facts) == []


def test_simulated_engine_needs_no_gpu_rdma_or_shm() -> None:
    assert preflight(SIMULATED, HostFacts(shm_bytes=64 * 1024 * 1024)) == []


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (replace(HEALTHY, kfd_present=False), "/dev/kfd is missing"),
        (replace(HEALTHY, render_nodes=()), "no /dev/dri/renderD*"),
        (replace(HEALTHY, render_nodes=FOUR_RENDER_NODES[:2]), "needs 4 GPU(s) but 2 are visible"),
        (replace(HEALTHY, render_nodes=EIGHT_RENDER_NODES), "needs 4 GPU(s) but 8 are visible"),
        (replace(HEALTHY, visible_devices={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}), "physical ids such as 4-7"),
        (replace(HEALTHY, visible_devices={"HIP_VISIBLE_DEVICES": "0,1,1,2"}), "lists a GPU twice"),
        (replace(HEALTHY, visible_devices={"HIP_VISIBLE_DEVICES": "0,1"}), "needs 4 GPU(s) but 2 are visible"),
        (replace(HEALTHY, visible_devices={"HIP_VISIBLE_DEVICES": ""}), "needs 4 GPU(s) but 0 are visible"),
        (
            replace(HEALTHY, visible_devices={"HIP_VISIBLE_DEVICES": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1"}),
            "vLLM refuses to start",
        ),
        (replace(HEALTHY, visible_devices={"ROCR_VISIBLE_DEVICES": "0,9"}), "ROCR_VISIBLE_DEVICES=0,9 names GPU"),
        (replace(HEALTHY, kfd_gpu_nodes=2), "KFD topology"),
        (replace(HEALTHY, partitions=(GpuPartition("renderD128", "CPX", "NPS4"),)), "renderD128: CPX/NPS4"),
        (replace(HEALTHY, partitions=(GpuPartition("renderD136", "SPX", "NPS4"),)), "not SPX/NPS1"),
        (replace(HEALTHY, shm_bytes=64 * 1024 * 1024), "/dev/shm is 64 MiB"),
        (replace(HEALTHY, shm_bytes=None), "/dev/shm is missing"),
        (replace(HEALTHY, rdma_devices=()), "/sys/class/infiniband lists no RDMA device"),
        (replace(HEALTHY, uverbs_nodes=()), "no /dev/infiniband/uverbs*"),
        (replace(HEALTHY, busy_ports={6301: "EADDRINUSE"}), "port 6301 is already in use (EADDRINUSE)"),
    ],
)
def test_each_problem_is_named(facts: HostFacts, expected: str) -> None:
    problems = preflight(PREFILL, facts)
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_rocr_uuids_are_counted_not_checked_as_indices() -> None:
    facts = replace(HEALTHY, visible_devices={"ROCR_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"})
    assert preflight(PREFILL, facts) == []


def test_hip_indices_refer_to_what_rocr_leaves_visible() -> None:
    facts = replace(
        HEALTHY,
        render_nodes=EIGHT_RENDER_NODES,
        kfd_gpu_nodes=8,
        visible_devices={"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "4"},
    )
    assert "physical ids" in preflight(PREFILL, facts)[0]


def test_unreadable_facts_do_not_fail_the_check() -> None:
    facts = replace(HEALTHY, kfd_gpu_nodes=None, partitions=())
    assert preflight(PREFILL, facts) == []


def test_backends_other_than_rdma_skip_the_rdma_check() -> None:
    facts = replace(HEALTHY, rdma_devices=(), uverbs_nodes=())
    assert preflight(replace(PREFILL, backend="xgmi"), facts) == []
    assert preflight(replace(PREFILL, backend="none"), facts) == []


def test_duplicate_ports_are_reported() -> None:
    assert "more than once" in preflight(replace(PREFILL, ports=(20005, 20005)), HEALTHY)[0]


def test_problems_accumulate() -> None:
    facts = HostFacts(shm_bytes=64 * 1024 * 1024, busy_ports={20005: "EADDRINUSE"})
    assert len(preflight(PREFILL, facts)) == 5


@pytest.mark.parametrize(("gpus", "requested", "expected"), [(4, None, 1024), (1, None, 0), (0, None, 0), (4, 0, 0)])
def test_default_shm_minimum_applies_to_multi_gpu_engines(gpus: int, requested: int | None, expected: int) -> None:
    assert effective_min_shm_mib(gpus, requested) == expected


def test_failure_message_fits_the_termination_message_limit() -> None:
    message = failure_message(PREFILL, ["x" * 1000] * 10)
    assert message.startswith("pdctl engine: preflight failed for the prefill engine:\n- x")
    assert len(message.encode()) <= 4096
    assert failure_message(PREFILL, ["short"]) == "pdctl engine: preflight failed for the prefill engine:\n- short\n"


def test_an_engine_of_another_vllm_release_is_refused_naming_both() -> None:
    needs = replace(SIMULATED, vllm_version="0.33.0")
    runs = replace(HostFacts(), engine_version="0.32.0+cpu", engine_version_source="the image's vllm metadata")
    [problem] = preflight(needs, runs)
    assert "declares vLLM 0.33.0" in problem and "runs vLLM 0.32.0+cpu (the image's vllm metadata)" in problem
    assert preflight(needs, replace(runs, engine_version="0.33.0+rocm723")) == []
    assert preflight(needs, replace(runs, engine_version="a dev build")) != []


def test_an_unread_or_undeclared_release_is_not_checked() -> None:
    assert preflight(replace(SIMULATED, vllm_version="0.33.0"), HostFacts()) == []
    assert preflight(SIMULATED, replace(HostFacts(), engine_version="0.32.0")) == []
