#!/usr/bin/env bash
# vLLM's official prefill/decode router (`vllm-router` on PyPI, a Rust extension) in its own virtual
# environment, outside the repo so fresh clones reuse it: the benchmark (benchmarks/proxy_overhead.py) and
# the contract comparison run it beside our proxy. Never one of our dependencies.
# Usage: benchmarks/router_venv.sh [VERSION]; prints the venv's path on stdout, progress on stderr.
set -euo pipefail
version=${1:-0.1.17}
cache=${PD_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-router}
venv=$cache/venv-$version
mkdir -p "$cache"
exec 9>"$cache/.lock-$version"
flock 9
if [[ ! -x $venv/bin/vllm-router || ! -f $venv/.installed ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip --disable-pip-version-check -q install "vllm-router==$version" >&2
  touch "$venv/.installed"
  echo "vllm-router $version installed in $venv" >&2
fi
echo "$venv"
