# shellcheck shell=bash
# Sourced after storage.sh by the scripts that run buildah or skopeo (build.sh, bud.sh): takes the build
# lock (a concurrent caller waits for it) and re-runs the calling script in a mount namespace of its own,
# whose /var/lib is an overlay with its upper layer in the cache. containers/image keeps root's blob-info
# cache in /var/lib/containers/cache, a path no flag or setting moves; this way that file, and anything
# else written under /var/lib, stays in the cache. A script started inside the namespace (build.sh runs
# bud.sh) is already there and holds the lock through its parent.
case ${PD_IMAGES_NAMESPACE:-} in
  "")
    exec 9>"$cache/.build.lock"
    flock 9
    PD_IMAGES_NAMESPACE=new exec unshare --mount --propagation private bash "$0" "$@"
    ;;
  new)
    mkdir -p "$cache/var-lib/upper" "$cache/var-lib/work"
    mount -t overlay pd-images-var-lib \
      -o "lowerdir=/var/lib,upperdir=$cache/var-lib/upper,workdir=$cache/var-lib/work" /var/lib
    export PD_IMAGES_NAMESPACE=entered
    ;;
esac
