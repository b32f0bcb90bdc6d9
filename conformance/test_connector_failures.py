"""What the simulator and the proxy assume about a failed write and mixed-TP writes, judged by the
installed vLLM's own connector and scheduler code (docs/vllm-versions.md, sim/versions.py).

- ``write_failed`` (vLLM 0.33 on): our frame is what vLLM's decode-side notify handler takes as a failure
  of that transfer; before 0.33 vLLM's handler refuses the type (so nothing can tell decode).
- ``write_done`` with ``num_writers``: a decode rank has its KV after that many frames (0.33 on).
- ``protocol.write_targets`` equals 0.33's ``compute_write_tp_mapping`` for every TP pair it accepts.
- ``kv_load_failure_policy`` is a ``KVTransferConfig`` key in every supported release, and the scheduler's
  ``_handle_failed_recving`` fails a request waiting for remote KV under ``fail`` and restarts it from
  token 0 under ``recompute``; a request not yet allocated (``WAITING``) is left alone, which is why the
  simulator keeps a failure notice until decode allocates the request.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import msgpack
import pytest
from pydantic import ValidationError
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common, moriio_engine
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from conformance.vllm_code import VLLM_VERSION
from pd_runtime import protocol
from pd_runtime.sim.versions import ConnectorBehaviour

WRITE = ConnectorBehaviour.of(VLLM_VERSION, read_mode=False)
TP_SIZES = (1, 2, 4, 8)


def _decode_wrapper() -> moriio_engine.MoRIIOWrapper:
    moriio_common.set_role(moriio_common.ROLE.CONSUMER)
    return moriio_engine.MoRIIOWrapper()


def test_write_failed_is_a_failure_to_vllms_decode_from_0_33() -> None:
    wrapper = _decode_wrapper()
    frame = protocol.write_failed_message("tx-1")
    if not WRITE.write_failed_notice:
        with pytest.raises(moriio_engine.MoRIIOError, match="write_failed"):
            wrapper._handle_structured_message(msgpack.unpackb(frame))
        return
    wrapper._handle_message(frame)
    assert wrapper.pop_failed_write_req_ids() == {"tx-1"}
    assert wrapper.pop_finished_write_req_ids() == set()


@pytest.mark.skipif(not WRITE.mixed_tp_write, reason=f"vLLM {VLLM_VERSION} counts one write_done per rank")
def test_a_decode_rank_waits_for_all_its_writers() -> None:
    wrapper = _decode_wrapper()
    wrapper._handle_message(protocol.write_done_message("tx-2", num_writers=2))
    assert wrapper.pop_finished_write_req_ids() == set()
    wrapper._handle_message(protocol.write_done_message("tx-2", num_writers=2))
    assert wrapper.pop_finished_write_req_ids() == {"tx-2"}


@pytest.mark.skipif(not WRITE.mixed_tp_write, reason=f"vLLM {VLLM_VERSION} has no write-mode TP mapping")
@pytest.mark.parametrize("kv_heads", [1, 4, 8])
def test_write_targets_are_vllms_tp_mapping(kv_heads: int) -> None:
    mapping = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_tp_mapping")
    compared = 0
    for prefill_tp in TP_SIZES:
        for decode_tp in TP_SIZES:
            try:
                mapping.validate_write_tp_topology(prefill_tp, decode_tp, kv_heads, False)
            except ValueError:
                continue
            for rank in range(prefill_tp):
                theirs = mapping.compute_write_tp_mapping(rank, prefill_tp, decode_tp, kv_heads, False, False)
                ours = protocol.write_targets(rank, prefill_tp, decode_tp, kv_heads)
                assert ours == [(t.tp_rank, t.num_writers) for t in theirs.targets], (prefill_tp, decode_tp, rank)
                compared += 1
    assert compared > 0


def test_kv_load_failure_policy_is_a_kv_transfer_config_key() -> None:
    for policy in ("fail", "recompute"):
        config = KVTransferConfig(kv_connector="MoRIIOConnector", kv_role="kv_consumer", kv_load_failure_policy=policy)
        assert config.kv_load_failure_policy == policy
    assert KVTransferConfig(kv_connector="MoRIIOConnector", kv_role="kv_consumer").kv_load_failure_policy == "fail"
    with pytest.raises(ValidationError):
        KVTransferConfig(kv_connector="MoRIIOConnector", kv_role="kv_consumer", kv_load_failure_policy="retry")


@pytest.mark.skipif(
    not hasattr(Scheduler, "_handle_failed_recving"), reason=f"vLLM {VLLM_VERSION} has no failed_recving path"
)
@pytest.mark.parametrize("recompute", [False, True])
def test_the_scheduler_fails_or_recomputes_a_request_waiting_for_kv(recompute: bool) -> None:
    waiting_kv = SimpleNamespace(status=RequestStatus.WAITING_FOR_REMOTE_KVS, num_computed_tokens=7)
    unallocated = SimpleNamespace(status=RequestStatus.WAITING, num_computed_tokens=0)
    scheduler = SimpleNamespace(
        requests={"kv": waiting_kv, "new": unallocated},
        recompute_kv_load_failures=recompute,
        failed_recving_kv_req_ids=set(),
    )
    failed = Scheduler._handle_failed_recving(scheduler, {"kv", "new"})  # type: ignore[arg-type]
    if recompute:
        assert failed == set() and waiting_kv.num_computed_tokens == 0
        assert scheduler.failed_recving_kv_req_ids == {"kv"}
    else:
        assert failed == {"kv"} and waiting_kv.num_computed_tokens == 7
    assert unallocated.num_computed_tokens == 0 and "new" not in scheduler.failed_recving_kv_req_ids
