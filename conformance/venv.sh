#!/usr/bin/env bash
# The conformance tier's virtual environment (make test-vllm): vLLM from PyPI at the given version plus
# this repository's package, outside the repo, so the multi-GB install survives fresh clones.
# Wheels are kept in $cache/wheels: a later install (another clone, a deleted venv) needs no download.
# Prints the venv's path on stdout; progress and timings go to stderr.
set -euo pipefail
version=${1:?usage: conformance/venv.sh VLLM_VERSION}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PD_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-vllm}
venv=$cache/venv-$version
wheels=$cache/wheels
mkdir -p "$wheels"
exec 9>"$cache/.lock-$version"
flock 9
if [[ ! -f $venv/.vllm-installed ]]; then
  start=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  if ! "${pip[@]}" install --no-index --find-links "$wheels" "vllm==$version" 2>/dev/null; then
    echo "downloading vllm $version and its dependencies into $wheels" >&2
    "${pip[@]}" download -d "$wheels" --find-links "$wheels" "vllm==$version" >&2
    "${pip[@]}" install --no-index --find-links "$wheels" "vllm==$version" >&2
  fi
  echo "vllm $version: venv made in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)" >&2
  touch "$venv/.vllm-installed"
fi
# This checkout's package, re-installed when the checkout or its dependencies change (editable: seconds).
stamp="$repo $(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
if [[ $(cat "$venv/.ours-installed" 2>/dev/null) != "$stamp" ]]; then
  "$venv/bin/python" -m pip --disable-pip-version-check -q install -e "$repo[api,proxy]" \
    'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3' >&2
  echo "$stamp" >"$venv/.ours-installed"
fi
echo "$venv"
