#!/usr/bin/env bash
# `buildah bud` as every build here runs it: private storage (storage.sh) and namespace (namespace.sh),
# cached layers (and no working container left behind by a failed step), no pull (every base is already
# in the private storage), the host's network (buildah would otherwise create a CNI bridge and turn on
# ip_forward in the machine's own network namespace), and the machine's CA bundle mounted over the
# image's for the RUN steps only, so pip verifies PyPI through this machine's TLS interception while no
# layer contains the bundle.
#
#   images/bud.sh [BUILDAH BUD ARGS...] CONTEXT
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/storage.sh"
source "$here/namespace.sh"
ca=/etc/ssl/certs/ca-certificates.crt
exec buildah bud --layers --force-rm --pull=never --network=host --volume "$ca:$ca:ro" "$@"
