#!/usr/bin/env bash
# Fetch third-party CRDs from their projects' Go modules at pinned versions into the Go module cache
# (outside the repo), as build-control-plane.sh fetches its modules. A warm cache returns at once.
# Usage: fetch-crds.sh prometheus|inference|keda; prints the directory holding the CRD YAML files last.
#   prometheus: the Prometheus Operator's (PodMonitor, ServiceMonitor, ...)
#   inference:  the Gateway API Inference Extension's (InferencePool, ...)
#   keda:       KEDA's (ScaledObject, ...)
set -euo pipefail
export GOTOOLCHAIN=local

case "${1:-}" in
  prometheus)
    module=github.com/prometheus-operator/prometheus-operator version=v0.85.0
    subdir=example/prometheus-operator-crd probe=monitoring.coreos.com_podmonitors.yaml ;;
  inference)
    module=sigs.k8s.io/gateway-api-inference-extension version=v1.0.1
    subdir=config/crd/bases probe=inference.networking.k8s.io_inferencepools.yaml ;;
  keda)
    module=github.com/kedacore/keda/v2 version=v2.18.1
    subdir=config/crd/bases probe=keda.sh_scaledobjects.yaml ;;
  *) echo "usage: $0 prometheus|inference|keda" >&2; exit 2 ;;
esac

dir=$(cd "${TMPDIR:-/tmp}" && go mod download -json "$module@$version" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
crds="$dir/$subdir"
[ -f "$crds/$probe" ] || { echo "no $probe in $crds" >&2; exit 1; }
echo "$crds"
