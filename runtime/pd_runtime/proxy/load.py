"""Pure: an engine's own view of its load, read from its vLLM ``/metrics`` text.

vLLM 0.31 exports, per engine core (label ``engine``: the DP rank), ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (a fraction, 1 = full; the name says
perc) from ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger). The proxy scrapes them off the
request path (``listener.Housekeeping``) and the ``least_load`` policy reads the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
# One sample line of the Prometheus text format: name, optional {labels}, value (a timestamp may follow).
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_ENGINE_LABEL = re.compile(r'(?:^|,)\s*engine="(?P<rank>[0-9]+)"')


@dataclass(frozen=True)
class EngineLoad:
    """One engine core's (DP rank's) scheduler state as it last reported it."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0

    @property
    def queue(self) -> int:
        return self.running + self.waiting

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": self.waiting, "kv_cache_usage": round(self.kv_usage, 4)}


def parse_engine_load(text: str) -> dict[int, EngineLoad]:
    """DP rank -> load from a /metrics page; a page without the gauges gives {} (e.g. not a vLLM engine).

    Only the three gauges are read, line by line (the page is small, but this runs every second for every
    engine): samples are summed per rank, so a page with several models still counts once per rank, and
    a sample without an ``engine`` label reads as rank 0 (one engine core). A value that is not a number
    raises ValueError.
    """
    values: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        sample = _SAMPLE.match(line)
        if sample is None or sample["name"] not in (RUNNING, WAITING, KV_USAGE):
            continue
        engine = _ENGINE_LABEL.search(sample["labels"] or "")
        per_rank = values.setdefault(int(engine["rank"]) if engine else 0, {})
        per_rank[sample["name"]] = per_rank.get(sample["name"], 0.0) + float(sample["value"])
    return {
        rank: EngineLoad(int(v.get(RUNNING, 0)), int(v.get(WAITING, 0)), min(1.0, max(0.0, v.get(KV_USAGE, 0.0))))
        for rank, v in values.items()
    }
