#!/usr/bin/env bash
# Build the fake node's device plugins (e2e/tools/devplugins: amd.com/gpu, rdma/hca_shared_devices_a,
# amd.com/nic through the kubelet's device-plugin API) and its DRA driver (gpu.amd.com through the
# kubelet's DRA plugin API, cmd/pd-fake-dra-driver) into a cache directory outside the repo, keyed
# by a hash of the module's sources: a change rebuilds, an unchanged tree returns at once. Runs the
# module's Go tests before installing, so a binary in the cache passed them. Prints the bin directory
# on its last line.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module="$here/tools/devplugins"
cache=${PD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-e2e}
key=$(cd "$module" && find . -name '*.go' -o -name 'go.mod' -o -name 'go.sum' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
bin="$cache/bin-devplugins-$key"
mkdir -p "$cache"
exec 9>"$cache/.build-devplugins.lock"
flock 9

log() { echo "[build-device-plugins] $*" >&2; }

if [ ! -x "$bin/pd-fake-device-plugins" ]; then
  log "testing and building e2e/tools/devplugins ($key)"
  (cd "$module" && nice -n 10 go test -count=1 ./... >&2)
  tmp="$bin.tmp"; rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$module" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp/" ./cmd/...)
  rm -rf "$bin"; mv "$tmp" "$bin"
fi
echo "$bin"
