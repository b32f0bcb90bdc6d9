#!/usr/bin/env bash
# Build the pinned control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and helm v3/v4 from Go modules into a cache directory outside the repo.
# `--node` adds what a real node runs (kubelet and kube-proxy from the same module graph, CoreDNS),
# `--kwok` adds KWOK (fake nodes for scale tests).
# Binaries are keyed by version and reused: a fresh machine builds everything, a warm one returns at once.
# Prints the bin directory on its last line.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.14
ETCD_SHA=fc04cf70
HELM3_VERSION=v3.21.4
HELM4_VERSION=v4.2.4
COREDNS_VERSION=v1.14.7
KWOK_VERSION=v0.8.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${PD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-e2e}
bin="$cache/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM3_VERSION-$HELM4_VERSION"
mkdir -p "$bin"
# One build at a time per cache: a concurrent caller waits here, then finds the binaries and returns.
exec 9>"$cache/.build.lock"
flock 9

log() { echo "[build-control-plane] $*" >&2; }

build_etcd() {
  [ -x "$bin/etcd" ] && return
  log "building etcd $ETCD_VERSION"
  (cd "$here/tools/etcd" && go build -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_SHA" \
    -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$bin/etcd.tmp" "$bin/etcd")
}

build_k8s() {  # $@ = commands of k8s.io/kubernetes/cmd
  local missing=() b
  for b in "$@"; do
    [ -x "$bin/$b" ] || missing+=("k8s.io/kubernetes/cmd/$b")
  done
  [ "${#missing[@]}" = 0 ] && return
  log "building $* $K8S_VERSION (cold: 15-30 min on 2 cores for the control plane, 4 for kubelet and kube-proxy)"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  local tmp="$bin/.k8s-tmp"; rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$here/tools/k8s" && go build -trimpath -ldflags "$ldf" -o "$tmp/" "${missing[@]}")
  mv "$tmp"/* "$bin/" && rmdir "$tmp"
}

build_helm() {  # $1 = module dir, $2 = version, $3 = output name, $4 = import root
  [ -x "$bin/$3" ] && return
  log "building $3 $2"
  (cd "$here/tools/$1" && go build -trimpath \
    -ldflags "-s -w -X $4/internal/version.version=$2" -o "$bin/$3.tmp" "$4/cmd/helm" && mv "$bin/$3.tmp" "$bin/$3")
}

build_tool() {  # $1 = module dir, $2 = version, $3 = output name, $4 = package, $5 = ldflags
  # kept beside the control plane in a directory of its own version, linked into the bin directory
  local dir="$cache/bin-$3-$2"
  if [ ! -x "$dir/$3" ]; then
    log "building $3 $2"
    mkdir -p "$dir"
    (cd "$here/tools/$1" && go build -trimpath -ldflags "-s -w $5" -o "$dir/$3.tmp" "$4" && mv "$dir/$3.tmp" "$dir/$3")
  fi
  ln -sfn "$dir/$3" "$bin/$3"
}

build_etcd
build_helm helm3 "$HELM3_VERSION" helm3 helm.sh/helm/v3
build_helm helm4 "$HELM4_VERSION" helm4 helm.sh/helm/v4
build_k8s kube-apiserver kube-controller-manager kube-scheduler kubectl
ln -sf helm3 "$bin/helm"
for arg in "$@"; do
  case "$arg" in
    --node)
      bash "$here/node-tools.sh"
      build_k8s kubelet kube-proxy
      build_tool coredns "$COREDNS_VERSION" coredns github.com/coredns/coredns \
        "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" ;;
    --kwok)
      build_tool kwok "$KWOK_VERSION" kwok sigs.k8s.io/kwok/cmd/kwok \
        "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" ;;
    *) log "unknown argument $arg (expected --node or --kwok)"; exit 2 ;;
  esac
done
log "binaries ready in $bin"
echo "$bin"
