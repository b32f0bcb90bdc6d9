"""Pure: a replica's transfer failures and expired KV by vLLM's own counters, since the last goodput probe.

vLLM's main branch exports the MoRI-IO connector's counters (docs/vllm-versions.md, "vLLM main's transfer
metrics"; no release through 0.34 does); the replica's proxy shows each engine's in its /status
(``instances[].moriio_metrics``). The operator sums them over the replica's engines and keeps what they
were when the last goodput probe finished, so ``sinceProbe`` says what failed after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pd_operator.api import EngineTransferStatus

COUNTERS = (
    "vllm:moriio_num_failed_transfers",
    "vllm:moriio_num_failed_notifications",
    "vllm:moriio_num_kv_expired_reqs",
)


def replica_totals(proxy_status: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Each of vLLM's counters summed over the instances the proxy reports; None when none reports any (a
    released vLLM, or no /status to read)."""
    instances = proxy_status.get("instances") if proxy_status is not None else None
    totals: dict[str, int] = {}
    for inst in instances if isinstance(instances, list) else ():
        moriio = inst.get("moriio_metrics") if isinstance(inst, Mapping) else None
        if not isinstance(moriio, Mapping):
            continue
        for name in COUNTERS:
            value = moriio.get(name)
            if isinstance(value, int | float) and value >= 0:
                totals[name] = totals.get(name, 0) + round(value)
    return totals or None


def engine_transfer(
    totals: dict[str, int] | None, prior: EngineTransferStatus | None, probe_time: str | None
) -> EngineTransferStatus | None:
    """The replica's status.engineTransfer from this read (``totals``; None: not read or none exported, the
    prior stands), the one this very pod had (``prior``) and when the last goodput probe finished.

    A probe newer than the prior's takes this read's totals as the new starting point; a pod's first read
    starts from 0. A counter below its starting point (an engine restarted) starts again from 0.
    """
    if totals is None:
        return prior
    if prior is None:
        start = dict.fromkeys(totals, 0)
    elif prior.probe_time != probe_time:
        start = dict(totals)
    else:
        start = {name: prior.at_probe.get(name, 0) for name in totals}
    start = {name: base if totals[name] >= base else 0 for name, base in start.items()}
    since = {name: totals[name] - start[name] for name in totals}
    return EngineTransferStatus(totals=totals, since_probe=since, at_probe=start, probe_time=probe_time)
