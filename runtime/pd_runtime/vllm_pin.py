"""The vLLM version the runtime image (Dockerfile.rocm) ships, in one place for Python code.

Behaviours of vLLM's MoRI-IO connector change between releases (docs/vllm-versions.md); the simulated
engine and the proxy's defaults follow this version unless told otherwise. tests/images checks that it
equals the image's ``VLLM_VERSION`` build argument.
"""

from __future__ import annotations

PINNED_VLLM_VERSION = "0.31.0"

# vLLM V1's max_num_seqs for the OpenAI server on GPUs with >= 70 GiB (MI300X), what an engine uses when
# the spec leaves it unset: the simulator's default, and the proxy's per-decode in-flight limit.
DEFAULT_MAX_NUM_SEQS = 1024
