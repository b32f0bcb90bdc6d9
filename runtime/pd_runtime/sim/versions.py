"""Pure: the MoRIIOConnector behaviours of a vLLM version that matter to the proxy.

Read in vLLM's released wheels (``vllm/distributed/kv_transfer/kv_connector/v1/moriio/``):
- 0.29.0 ``moriio_connector.py``, ``MoRIIOConnectorScheduler.get_num_new_matched_tokens``: on a decode
  engine every request is a remote prefill, whatever its ``kv_transfer_params``: write mode returns
  ``(prompt - computed, True)`` (wait for KV), read mode ``(prompt - 1 - computed, False)`` (claims the
  prompt as loaded; ``update_state_after_alloc`` then loads nothing without ``do_remote_prefill``).
- 0.32.0: write mode returns ``(0, False)`` without ``do_remote_prefill``; read mode unchanged.
- 0.33.0: both modes return ``(0, False)`` without ``do_remote_prefill``.
- Before 0.32 a preempted write-mode decode request waits a second time for KV that never comes
  (vLLM PRs #53250, #53549, #57705, fixed in 0.32.0; ../shared/reference/real-world.md).
- 0.31.0, measured in the live tier (live/test_faults.py ``test_disconnect_during_kv_wait``): a write-mode
  decode request aborted while it waits for its KV keeps its KV blocks for good. Simulated for 0.31 only,
  the release where it was seen; earlier and later releases are not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pd_runtime.vllm_pin import PINNED_VLLM_VERSION

WRITE_GUARD = (0, 32, 0)
READ_GUARD = (0, 33, 0)
PREEMPTION_FIX = (0, 32, 0)
ABORT_LEAK_SEEN = ((0, 31, 0), (0, 32, 0))
_VERSION_RE = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """``0.29.0`` (or ``0.29``, or ``v0.29.0rc1``) -> (0, 29, 0); ValueError for anything else."""
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(match["major"]), int(match["minor"]), int(match["patch"] or 0)


@dataclass(frozen=True)
class ConnectorBehaviour:
    version: tuple[int, int, int]
    read_mode: bool

    @classmethod
    def of(cls, version: str = PINNED_VLLM_VERSION, read_mode: bool = False) -> ConnectorBehaviour:
        return cls(parse_version(version), read_mode)

    @property
    def plain_decode_waits_for_kv(self) -> bool:
        """A request without ``do_remote_prefill`` on a write-mode decode engine waits for KV forever."""
        return not self.read_mode and self.version < WRITE_GUARD

    @property
    def plain_decode_skips_prefill(self) -> bool:
        """A request without ``do_remote_prefill`` on a read-mode decode engine decodes from KV it never
        loaded (silently wrong output)."""
        return self.read_mode and self.version < READ_GUARD

    @property
    def preempted_remote_stalls(self) -> bool:
        """A preempted write-mode decode request waits for its KV again and never runs."""
        return not self.read_mode and self.version < PREEMPTION_FIX

    @property
    def aborted_kv_wait_keeps_blocks(self) -> bool:
        """A write-mode decode request aborted while waiting for its KV keeps its blocks (a leak)."""
        low, high = ABORT_LEAK_SEEN
        return not self.read_mode and low <= self.version < high
