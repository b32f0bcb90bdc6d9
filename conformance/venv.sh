#!/usr/bin/env bash
# The conformance tier's virtual environment (make test-vllm): vLLM from PyPI at the given version (less
# flashinfer-python, below) plus this repository's package (cache, lock and helpers: conformance/venv-common.sh).
# Prints the venv's path on stdout; progress and timings go to stderr.
set -euo pipefail
version=${1:?usage: conformance/venv.sh VLLM_VERSION}
source "$(dirname "${BASH_SOURCE[0]}")/venv-common.sh"
vllm_venv_open "venv-$version" ".lock-$version"
if ! vllm_venv_installed; then
  vllm_venv_create
  # vllm itself, then its requirements less flashinfer-python: CUDA attention kernels the tier never runs,
  # and 0.34.0 pins flashinfer-python==0.7.3, a release PyPI does not serve (so `pip install vllm==0.34.0`
  # cannot resolve).
  install_or_fetch --no-deps "vllm==$version" packaging
  requirements_of vllm flashinfer-python >"$venv/requirements.txt"
  install_or_fetch -r "$venv/requirements.txt"
  vllm_venv_made "vllm $version"
fi
install_ours "$repo $(sha256sum "$repo/pyproject.toml" | cut -c1-16)" -e "$repo[api,proxy]" \
  'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
