#!/usr/bin/env bash
# Build the pinned control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and helm v3/v4 from Go modules into a cache directory outside the repo.
# Binaries are keyed by version and reused: a fresh machine builds everything, a warm one returns at once.
# Prints the bin directory on its last line.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.14
ETCD_SHA=fc04cf70
HELM3_VERSION=v3.21.4
HELM4_VERSION=v4.2.4

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

build_k8s() {
  local missing=0 b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$bin/$b" ] || missing=1
  done
  [ "$missing" = 0 ] && return
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (cold: 15-30 min on 2 cores)"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  local tmp="$bin/.k8s-tmp"; rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$here/tools/k8s" && go build -trimpath -ldflags "$ldf" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  mv "$tmp"/* "$bin/" && rmdir "$tmp"
}

build_helm() {  # $1 = module dir, $2 = version, $3 = output name, $4 = import root
  [ -x "$bin/$3" ] && return
  log "building $3 $2"
  (cd "$here/tools/$1" && go build -trimpath \
    -ldflags "-s -w -X $4/internal/version.version=$2" -o "$bin/$3.tmp" "$4/cmd/helm" && mv "$bin/$3.tmp" "$bin/$3")
}

build_etcd
build_helm helm3 "$HELM3_VERSION" helm3 helm.sh/helm/v3
build_helm helm4 "$HELM4_VERSION" helm4 helm.sh/helm/v4
build_k8s
ln -sf helm3 "$bin/helm"
log "binaries ready in $bin"
echo "$bin"
