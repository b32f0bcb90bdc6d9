"""Pure: which vLLM release a simulated engine reproduces, and the MoRIIOConnector behaviours of that
release that matter to the proxy (the facts and their sources: ``pd_runtime.vllm_releases``).

No dependency of the sim extra: the engine launcher reads the release of a ``pdctl sim-engine`` command
here, on any install.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pd_runtime.vllm_pin import PINNED_VLLM_VERSION
from pd_runtime.vllm_releases import Release, release

VERSION_FLAG = "--vllm-version"
VERSION_ENV = "PD_SIM_VLLM_VERSION"
MORIIO_METRICS_FLAG = "--sim-moriio-metrics"
"""Export vLLM main's ``vllm:moriio_*`` transfer metrics (sim/metrics.py). No release through 0.34 has them,
so an engine of any --vllm-version exports none unless asked: the flag stands for an unreleased vLLM."""


def simulated_version(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The release ``pdctl sim-engine ARGV`` reproduces: its --vllm-version, else PD_SIM_VLLM_VERSION, else
    the image pin."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(VERSION_FLAG, "--vllm_version", default=None)
    ns, _ = parser.parse_known_args(list(argv))
    return str(ns.vllm_version or env.get(VERSION_ENV) or PINNED_VLLM_VERSION)


@dataclass(frozen=True)
class ConnectorBehaviour:
    release: Release
    read_mode: bool

    @classmethod
    def of(cls, version: str = PINNED_VLLM_VERSION, read_mode: bool = False) -> ConnectorBehaviour:
        return cls(release(version), read_mode)

    @property
    def plain_decode_waits_for_kv(self) -> bool:
        """A request without ``do_remote_prefill`` on a write-mode decode engine waits for KV forever."""
        return not self.read_mode and not self.release.plain_decode_guard_write

    @property
    def plain_decode_skips_prefill(self) -> bool:
        """A request without ``do_remote_prefill`` on a read-mode decode engine decodes from KV it never
        loaded (silently wrong output)."""
        return self.read_mode and not self.release.plain_decode_guard_read

    @property
    def preempted_remote_stalls(self) -> bool:
        """A preempted write-mode decode request waits for its KV again and never runs."""
        return not self.read_mode and not self.release.preemption_fixed

    @property
    def aborted_kv_wait_keeps_blocks(self) -> bool:
        """A write-mode decode request aborted while waiting for its KV keeps its blocks (a leak)."""
        return not self.read_mode and self.release.kv_wait_abort_leak_seen

    @property
    def write_failed_notice(self) -> bool:
        """A write-mode prefill that gives up waiting for decode's block list tells decode (``write_failed``),
        and decode ends the request by its ``kv_load_failure_policy`` instead of waiting."""
        return not self.read_mode and self.release.write_failed

    @property
    def mixed_tp_write(self) -> bool:
        """Write mode moves KV between a prefill and a decode engine of different TP sizes (fan-out/fan-in),
        whichever mode this engine runs (the operator asks it of a write-mode layout)."""
        return self.release.heterogeneous_tp_write

    @property
    def unallocated_read_releases(self) -> bool:
        """A read-mode decode request aborted before its blocks were allocated releases prefill's blocks."""
        return self.read_mode and self.release.read_abort_releases_blocks


def decode_alone_refusal(version: str, read_mode: bool) -> str | None:
    """Why the proxy may not serve requests on a decode engine of vLLM ``version`` alone (selective
    disaggregation, docs/proxy.md), or None when its decode computes a plain request itself."""
    behaviour = ConnectorBehaviour.of(version, read_mode)
    if behaviour.plain_decode_waits_for_kv:
        return (
            f"vLLM {version} in write mode treats a plain request on a decode engine as a remote prefill and waits "
            "for KV that never comes (guarded from 0.32)"
        )
    if behaviour.plain_decode_skips_prefill:
        return (
            f"vLLM {version} in read mode decodes a plain request on a decode engine from KV it never loaded "
            "(guarded from 0.33)"
        )
    return None
