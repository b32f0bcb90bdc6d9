"""extraArgs words the guard on managed flags refuses and takes: one table, judged by three tiers.

The unit suite checks pydantic (``pdctl render``), e2e the API server's CEL rule, and the conformance
tier vLLM's own parser: a refused word sets the guarded destination exactly as its canonical spelling
does (or vLLM refuses it too: an ambiguous prefix); a taken word leaves every guarded destination as the
operator rendered it. Values differ from what the operator renders, so an override shows.
"""

from __future__ import annotations

KV = '{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer"}'

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
    ("--data-parallel-s", "2"): None,  # also --data-parallel-size-local
    ("-d", "2"): None,
    ("--p", "9000"): None,
}

# words the guard takes: none of them sets a flag the operator renders
ACCEPTED: tuple[tuple[str, ...], ...] = (
    ("--max_num_seqs", "8"),
    ("--max-num-seq=8",),
    ("--enforce-eager",),
    ("--kv-cache-dtype=auto",),
    ("--data-parallel-size-local", "1"),
    ("--pipeline_parallel_size=1",),
    ("-pp", "1"),
    ("--compilation-config.cudagraph_mode=PIECEWISE",),
    ("--seed", "-1"),
)

# compilation config: words vllm_flags.names_flag reads as it (the read-mode rule and command_lines use it)
COMPILATION_CONFIG: tuple[tuple[str, ...], ...] = (
    ("-cc.cudagraph_mode=PIECEWISE",),
    ("--compilation_config", '{"cudagraph_mode": "PIECEWISE"}'),
    ("--compilation-conf.cudagraph_mode=PIECEWISE",),
)
