"""The conformance tier (make test-vllm): runs in its own venv with vLLM from PyPI (conformance/venv.sh).

vLLM cannot infer a device on a CPU-only machine; ``VLLM_TARGET_DEVICE=cpu`` is vLLM's own switch to its
CPU platform and must be set before vLLM is first imported, hence here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `conformance.*` and `tests.operator.*`
