"""Pure: the MoRI-IO connector's own transfer metrics, read from an engine's vLLM ``/metrics`` page.

vLLM's main branch exports them (``vllm/distributed/kv_transfer/kv_connector/v1/moriio/stats.py``,
``MoRIIOPromMetrics``; no release through 0.34 has them), one series per engine core (labels
``model_name`` and ``engine``): the histograms ``vllm:moriio_xfer_time_seconds``,
``vllm:moriio_post_time_seconds``, ``vllm:moriio_bytes_transferred`` and ``vllm:moriio_num_descriptors``
(one observation per successful transfer), and the counters ``vllm:moriio_num_failed_transfers``,
``vllm:moriio_num_failed_notifications`` and ``vllm:moriio_num_kv_expired_reqs`` (counted on the prefill
engine). docs/vllm-versions.md has the source. The proxy's ``/status`` shows them per instance under those
names, each summed over its labels; an engine without them shows none, and the proxy's own transfer
metrics (docs/proxy.md) count for every release.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

PREFIX = "vllm:moriio_"
FAILED_TRANSFERS = "vllm:moriio_num_failed_transfers"
KV_EXPIRED = "vllm:moriio_num_kv_expired_reqs"


class Sample(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> float: ...


class Family(Protocol):
    """One metric family as prometheus_client's text parser gives it."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def samples(self) -> Sequence[Sample]: ...


@dataclass(frozen=True)
class HistogramTotals:
    """A histogram summed over its series: observations and their sum (the buckets are left out)."""

    count: float
    sum: float

    def to_json(self) -> dict[str, float]:
        return {"count": self.count, "sum": self.sum}


@dataclass(frozen=True)
class MoriioMetrics:
    """One engine's ``vllm:moriio_*`` families: each counter and histogram summed over its labels."""

    counters: dict[str, float]
    histograms: dict[str, HistogramTotals]

    def to_json(self) -> dict[str, Any]:
        return {**self.counters, **{name: totals.to_json() for name, totals in self.histograms.items()}}


def moriio_lines(page: str) -> str | None:
    """The lines of a /metrics page that name a ``vllm:moriio_*`` family, for the text parser (the page is
    read every scrape interval and most of it is other families); None when there are none."""
    if PREFIX not in page:
        return None
    return "\n".join(line for line in page.splitlines() if PREFIX in line) + "\n"


def moriio_totals(families: Iterable[Family]) -> MoriioMetrics | None:
    """The ``vllm:moriio_*`` counters and histograms among parsed families, each summed over its labels;
    None when there are none (a released vLLM)."""
    counters: dict[str, float] = {}
    histograms: dict[str, HistogramTotals] = {}
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        if family.type == "counter":
            counters[family.name] = sum(s.value for s in family.samples if s.name == family.name + "_total")
        elif family.type == "histogram":
            histograms[family.name] = HistogramTotals(
                count=sum(s.value for s in family.samples if s.name == family.name + "_count"),
                sum=sum(s.value for s in family.samples if s.name == family.name + "_sum"),
            )
    if not counters and not histograms:
        return None
    return MoriioMetrics(counters, histograms)
