"""The engine gauges the proxy's least_load policy reads are vLLM's own, per engine core.

``pd_runtime.proxy.load`` reads ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` and takes the ``engine`` label as the DP rank. Instantiating vLLM's stat
logger needs a model config (a downloaded model), so this reads the logger's code at the pinned version,
as tests/chart reads its metric families.
"""

from __future__ import annotations

import inspect
import re

from vllm.v1.metrics import loggers

from pd_runtime.proxy.load import KV_USAGE, RUNNING, WAITING


def test_the_gauges_least_load_reads_are_declared_per_engine_core() -> None:
    source = inspect.getsource(loggers.PrometheusStatLogger.__init__)
    assert 'labelnames = ["model_name", "engine"]' in source
    per_engine = re.compile(
        r"per_engine_labelvalues[^=]*= \{\s*idx: \[model_name, str\(idx\)\] for idx in engine_indexes"
    )
    assert per_engine.search(source), "the engine label is no longer the engine index"
    for name in (RUNNING, WAITING, KV_USAGE):
        declared = re.search(rf'self\._gauge_cls\(\s*name="{re.escape(name)}",(?P<args>.*?)\)', source, re.S)
        assert declared, f"{name} is not a gauge of PrometheusStatLogger"
        assert "labelnames=labelnames," in declared["args"], f"{name} lost the per-engine labels"
