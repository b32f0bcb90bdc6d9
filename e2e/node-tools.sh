#!/usr/bin/env bash
# What a real node runs from Debian's packages, installed when missing (needs root and apt): containerd
# (and ctr), runc (crun refuses this kind of machine's hybrid cgroups), the CNI plugins (bridge,
# host-local, loopback, portmap), iptables for kube-proxy, nsenter and iproute2 for the node's namespace.
# docs/e2e-real-node.md.
set -euo pipefail
declare -A package_of=(
  [containerd]=containerd [ctr]=containerd [runc]=runc [iptables]=iptables [nsenter]=util-linux [ip]=iproute2
)
missing=()
for tool in "${!package_of[@]}"; do
  command -v "$tool" >/dev/null || missing+=("${package_of[$tool]}")
done
for plugin in bridge host-local loopback portmap; do
  [[ -x /usr/lib/cni/$plugin ]] || missing+=(containernetworking-plugins)
done
((${#missing[@]} == 0)) && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "[node-tools] installing ${missing[*]} from Debian's packages" >&2
# Another apt run (an image build, another tool) may hold the dpkg lock for a while: wait for it.
apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
# With systemd the package also starts the machine's own containerd; the nodes never use it (each runs its own).
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  "${missing[@]}" >&2
