#!/usr/bin/env bash
# Fetch the Prometheus Operator's CRDs (PodMonitor, ServiceMonitor, ...) from its Go module at a pinned
# version into the Go module cache (outside the repo), as build-control-plane.sh fetches its modules.
# A warm cache returns at once. Prints the directory holding the CRD YAML files on its last line.
set -euo pipefail
export GOTOOLCHAIN=local

PROMETHEUS_OPERATOR_VERSION=v0.85.0
module=github.com/prometheus-operator/prometheus-operator

dir=$(cd "${TMPDIR:-/tmp}" && go mod download -json "$module@$PROMETHEUS_OPERATOR_VERSION" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
crds="$dir/example/prometheus-operator-crd"
[ -f "$crds/monitoring.coreos.com_podmonitors.yaml" ] || { echo "no PodMonitor CRD in $crds" >&2; exit 1; }
echo "$crds"
