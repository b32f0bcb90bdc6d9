#!/usr/bin/env bash
# The conformance tier's virtual environment (make test-vllm): vLLM from PyPI at the given version plus
# this repository's package (cache, lock and helpers: conformance/venv-common.sh).
# Prints the venv's path on stdout; progress and timings go to stderr.
set -euo pipefail
version=${1:?usage: conformance/venv.sh VLLM_VERSION}
source "$(dirname "${BASH_SOURCE[0]}")/venv-common.sh"
vllm_venv_open "venv-$version" ".lock-$version"
if ! vllm_venv_installed; then
  vllm_venv_create
  if ! "${pip[@]}" install "${offline[@]}" "vllm==$version" 2>/dev/null; then
    echo "downloading vllm $version and its dependencies into $wheels" >&2
    fetch "vllm==$version"
    "${pip[@]}" install "${offline[@]}" "vllm==$version" >&2
  fi
  vllm_venv_made "vllm $version"
fi
install_ours "$repo $(sha256sum "$repo/pyproject.toml" | cut -c1-16)" -e "$repo[api,proxy]" \
  'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
