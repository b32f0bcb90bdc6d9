#!/usr/bin/env bash
# The image tools from Debian's packages, installed when one is missing (needs root and apt): buildah
# builds, podman runs the smoke checks, skopeo exports docker-archives, mmdebstrap makes the base rootfs,
# runc runs build steps and containers (crun refuses hybrid cgroups), uidmap gives newuidmap/newgidmap.
# The Go toolchain (for the pause binary) is the one the control-plane build uses (e2e/build-control-plane.sh).
set -euo pipefail
declare -A package_of=(
  [buildah]=buildah [podman]=podman [skopeo]=skopeo [mmdebstrap]=mmdebstrap [runc]=runc
  [newuidmap]=uidmap [conmon]=conmon
)
missing=()
for tool in "${!package_of[@]}"; do
  command -v "$tool" >/dev/null || missing+=("${package_of[$tool]}")
done
[[ -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
((${#missing[@]} == 0)) && exit 0
echo "[images] installing ${missing[*]} from Debian's packages" >&2
# Another apt run (another build, another tool) holds the dpkg lock for a while: wait for it.
apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  "${missing[@]}" >&2
