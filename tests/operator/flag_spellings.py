"""extraArgs words the guard on managed flags refuses and takes: one table, judged by three tiers.

The unit suite checks pydantic (``pdctl render``), e2e the API server's CEL rule, and the conformance
tier vLLM's own parser: a refused word sets the guarded destination exactly as its canonical spelling
does (or vLLM refuses it too: an ambiguous prefix); a taken word leaves every guarded destination as the
operator rendered it. Values differ from what the operator renders, so an override shows.
"""

from __future__ import annotations

KV = '{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer"}'
EVENTS = '{"enable_kv_cache_events": true}'

# words -> the canonical words vLLM reads them as (None: vLLM refuses them as an ambiguous prefix)
REFUSED: dict[tuple[str, ...], tuple[str, ...] | None] = {
    ("--port=9000",): ("--port", "9000"),
    ("--por", "9000"): ("--port", "9000"),
    ("--po", "9000"): None,  # also --pooler-config
    ("--port.x=1",): ("--port", '{"x": 1}'),
    ("-tp", "2"): ("-tp", "2"),
    ("-tp=2",): ("-tp", "2"),
    ("-t", "2"): ("-tp", "2"),
    ("--tensor_parallel-size=2",): ("-tp", "2"),
    ("--tensor_parallel_size", "2"): ("-tp", "2"),
    ("--tensor-par=2",): ("-tp", "2"),
    ("-dp=2",): ("--data-parallel-size", "2"),
    ("--data_parallel_size", "2"): ("--data-parallel-size", "2"),
    (f"--kv-transfer_config={KV}",): ("--kv-transfer-config", KV),
    ("--kv_transfer_config", KV): ("--kv-transfer-config", KV),
    ("--kv-transfer", KV): ("--kv-transfer-config", KV),
    ("--kv-transfer-config.kv_role=kv_producer",): ("--kv-transfer-config", '{"kv_role": "kv_producer"}'),
    ("--kv_transfer_config.kv_connector_extra_config.proxy_ip=10.0.0.9",): (
        "--kv-transfer-config",
        '{"kv_connector_extra_config": {"proxy_ip": "10.0.0.9"}}',
    ),
    ("--served_model_name=other",): ("--served-model-name", "other"),
    ("--served-model", "other"): ("--served-model-name", "other"),
    ("--distributed-executor-backend", "ray"): ("--distributed-executor-backend", "ray"),
    ("--distributed_exec=ray",): ("--distributed-executor-backend", "ray"),
    # where an engine listens, and with what key
    ("--host", "0.0.0.0"): ("--host", "0.0.0.0"),
    ("--host=0.0.0.0",): ("--host", "0.0.0.0"),
    ("--ho", "0.0.0.0"): ("--host", "0.0.0.0"),
    ("--uds", "/tmp/engine.sock"): ("--uds", "/tmp/engine.sock"),
    ("--ud=/tmp/engine.sock",): ("--uds", "/tmp/engine.sock"),
    ("--api_key=k",): ("--api-key", "k"),
    ("--api-k", "k"): ("--api-key", "k"),
    ("-dpa", "0.0.0.0"): ("--data-parallel-address", "0.0.0.0"),
    ("--data_parallel_addr=0.0.0.0",): ("--data-parallel-address", "0.0.0.0"),
    ("-dpp=29999",): ("--data-parallel-rpc-port", "29999"),
    ("--data-parallel-sup=9999",): ("--data-parallel-supervisor-port", "9999"),
    ("--kv_events", EVENTS): ("--kv-events-config", EVENTS),
    ("--kv-events-config.enable_kv_cache_events=true",): ("--kv-events-config", EVENTS),
    # the process layout
    ("--headless",): ("--headless",),
    ("--headl",): ("--headless",),
    ("-asc=2",): ("--api-server-count", "2"),
    ("--api-server=2",): ("--api-server-count", "2"),
    ("--data-parallel-size-local", "2"): ("--data-parallel-size-local", "2"),
    ("-dpl", "2"): ("--data-parallel-size-local", "2"),
    ("--data_parallel_size_local=2",): ("--data-parallel-size-local", "2"),
    ("-dpr", "1"): ("--data-parallel-start-rank", "1"),
    ("-dpn", "1"): ("--data-parallel-rank", "1"),
    ("-dph",): ("--data-parallel-hybrid-lb",),
    ("--data-parallel-external-lb",): ("--data-parallel-external-lb",),
    ("--data-parallel-multi",): ("--data-parallel-multi-port-external-lb",),
    ("-dpb", "ray"): ("--data-parallel-backend", "ray"),
    ("--nno", "2"): ("--nnodes", "2"),
    ("-n2",): ("--nnodes", "2"),
    ("-n=2",): ("--nnodes", "2"),
    ("--node_rank=1",): ("--node-rank", "1"),
    ("-r1",): ("--node-rank", "1"),
    # the GPU arithmetic
    ("-pp", "2"): ("--pipeline-parallel-size", "2"),
    ("--pipeline_parallel_size=2",): ("--pipeline-parallel-size", "2"),
    ("--pipeline", "2"): ("--pipeline-parallel-size", "2"),
    ("-pcp", "2"): ("--prefill-context-parallel-size", "2"),
    ("--device_ids=0,1",): ("--device-ids", "0,1"),
    # a config file: vLLM reads only the exact --config (conformance/test_extra_args_guard.py)
    ("--config", "serve.yaml"): ("--config", "serve.yaml"),
    ("--config=serve.yaml",): ("--config", "serve.yaml"),
    ("--conf", "serve.yaml"): None,  # also --config-format
    # ambiguous prefixes
    ("--data-parallel-s", "2"): None,  # --data-parallel-size and --data-parallel-size-local
    ("--api", "k"): None,
    ("--dis", "ray"): None,
    ("-d", "2"): None,
    ("--p", "9000"): None,
}

# words the guard takes: none of them sets a flag the operator renders
ACCEPTED: tuple[tuple[str, ...], ...] = (
    ("--max_num_seqs", "8"),
    ("--max-num-seq=8",),
    ("--enforce-eager",),
    ("--kv-cache-dtype=auto",),
    ("-dcp", "1"),
    ("--master-port", "29600"),
    ("--root-path", "/engine"),
    ("--compilation-config.cudagraph_mode=PIECEWISE",),
    ("--seed", "-1"),
)

# compilation config: words vllm_flags.names_flag reads as it (the read-mode rule and command_lines use it)
COMPILATION_CONFIG: tuple[tuple[str, ...], ...] = (
    ("-cc.cudagraph_mode=PIECEWISE",),
    ("--compilation_config", '{"cudagraph_mode": "PIECEWISE"}'),
    ("--compilation-conf.cudagraph_mode=PIECEWISE",),
)
