#!/usr/bin/env bash
# The base image: a Debian bookworm rootfs with Python 3.11 (the minor of python:3.11-slim-bookworm) made
# by mmdebstrap from deb.debian.org, imported with `buildah from scratch`. Prints its name on stdout.
#
# Pinned by package versions: snapshot.debian.org is out of reach here and deb.debian.org serves only the
# current bookworm versions, so the build installs the top-level packages at the locked versions and fails
# unless the whole rootfs equals base/packages.lock (then PD_IMAGES_RELOCK=1 rewrites the lock from what
# the archive has). The rootfs tarball and the image are cached by a key of the lock and this script: a
# warm run reuses them. Called by build.sh, under its lock.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/storage.sh"
lock=$here/base/packages.lock
top_level=(python3 python3-venv python3-pip ca-certificates)
mirrors=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# mmdebstrap's clamp for file times, so the same packages give the same tarball.
export SOURCE_DATE_EPOCH=1735689600

# The cache key, the image's name and the tarball's path, from the lock as it is now.
keyed() {
  key=$(cat "$lock" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
  name=localhost/pd-operator/debian-python:bookworm-$key
  tarball=$cache/base/rootfs-$key.tar
}
keyed
log() { echo "[images] $*" >&2; }

if buildah inspect --type image "$name" >/dev/null 2>&1; then
  echo "$name"
  exit 0
fi

locked() { grep -v '^#' "$lock"; }

make_rootfs() {
  local includes=("${top_level[@]}") listed=$cache/base/packages-$key.txt
  if [[ ${PD_IMAGES_RELOCK:-} != 1 ]]; then
    mapfile -t includes < <(locked | grep -E "^($(IFS='|'; echo "${top_level[*]}"))=")
  fi
  log "making the base rootfs with mmdebstrap (${includes[*]})"
  mkdir -p "$cache/base"
  mmdebstrap --quiet --variant=minbase --include="${includes[*]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package}=\${Version}\n' | sort > '$listed'" \
    bookworm "$tarball.tmp" "${mirrors[@]}"
  if [[ ${PD_IMAGES_RELOCK:-} == 1 ]]; then
    { grep '^#' "$lock"; cat "$listed"; } >"$lock.new" && mv "$lock.new" "$lock"
    log "wrote $lock from the archive's versions"
    mv "$tarball.tmp" "$tarball.relocked"
    keyed
    mv "$tarball.relocked" "$tarball"
    return
  fi
  if ! diff <(locked) "$listed" >&2; then
    log "the rootfs differs from $lock (above: - locked, + now in the archive); PD_IMAGES_RELOCK=1 images/build.sh refreshes the lock"
    rm -f "$tarball.tmp"
    exit 1
  fi
  mv "$tarball.tmp" "$tarball"
}

[[ -f $tarball ]] || make_rootfs
log "importing $tarball as $name"
container=$(buildah from --quiet scratch)
trap 'buildah rm "$container" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$container" "$tarball" / >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
  --cmd python3 --label dev.serving.pd.base.lock="$key" "$container"
buildah commit --quiet --rm "$container" "$name" >/dev/null
trap - EXIT
echo "$name"
