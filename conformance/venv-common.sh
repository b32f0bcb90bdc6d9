# shellcheck shell=bash
# What conformance/venv.sh and live/venv.sh share (sourced by both): where the cache and the shared wheel
# directory are, the venv's lock, the helpers that make a venv and download into the wheels, and the
# re-install of this checkout's package. Both venvs live outside the repo, so the multi-GB installs
# survive fresh clones; a later install (another clone, a deleted venv) needs no download.
#
# After `vllm_venv_open NAME LOCK` the caller holds $cache/LOCK (fd 9) until it exits and has $venv.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PD_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-vllm}
wheels=$cache/wheels
# Downloads into the shared wheel directory happen under the conformance tier's lock.
wheels_lock=$cache/.lock-$version

vllm_venv_open() {
  venv=$cache/$1
  venv_lock=$cache/$2
  mkdir -p "$wheels"
  exec 9>"$venv_lock"
  flock 9
}

vllm_venv_installed() {
  [[ -f $venv/.vllm-installed ]]
}

# A fresh venv (the old one removed); $py, $pip and $offline (install from the wheels only) for it.
vllm_venv_create() {
  venv_start=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv"
  py=$venv/bin/python
  pip=("$py" -m pip --disable-pip-version-check -q)
  offline=(--no-index --find-links "$wheels")
}

# pip download into the wheels, under the wheels' lock (already held when it is the venv's own).
fetch() {
  if [[ $venv_lock == "$wheels_lock" ]]; then
    "${pip[@]}" download -d "$wheels" --find-links "$wheels" "$@" >&2
    return
  fi
  (
    flock 8
    "${pip[@]}" download -d "$wheels" --find-links "$wheels" "$@" >&2
  ) 8>"$wheels_lock"
}

# ARGS...: pip install from the wheels; what is missing there is downloaded first (under the wheels' lock).
install_or_fetch() {
  "${pip[@]}" install "${offline[@]}" "$@" 2>/dev/null && return
  echo "downloading into $wheels: $*" >&2
  fetch "$@"
  "${pip[@]}" install "${offline[@]}" "$@" >&2
}

# DIST SKIP...: DIST's requirements on this machine (markers evaluated, no extras) less the SKIP names, one a
# line (needs packaging in the venv).
requirements_of() {
  "$py" - "$@" <<'PY'
import importlib.metadata
import sys

from packaging.requirements import Requirement

dist, skip = sys.argv[1], set(sys.argv[2:])
for line in importlib.metadata.requires(dist) or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name not in skip:
        print(req)
PY
}

# LABEL: "LABEL: venv made in N s, SIZE" on stderr, and the venv marked complete.
vllm_venv_made() {
  echo "$1: venv made in $(($(date +%s) - venv_start)) s, $(du -sh "$venv" | cut -f1)" >&2
  touch "$venv/.vllm-installed"
}

# STAMP PIP_ARGS...: this checkout's package (editable: seconds), re-installed when STAMP (the checkout and
# a hash of its dependency files) changed since the last install. Then the venv's path on stdout.
install_ours() {
  local stamp=$1
  shift
  if [[ $(cat "$venv/.ours-installed" 2>/dev/null) != "$stamp" ]]; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "$@" >&2
    echo "$stamp" >"$venv/.ours-installed"
  fi
  echo "$venv"
}
