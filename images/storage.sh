# shellcheck shell=bash
# Private container storage and configuration for buildah, podman and skopeo, sourced by build.sh and
# base.sh (the tests read the same variables from build.sh's manifest): graph root, run root,
# storage.conf, containers.conf and registries.conf all live under the image cache, named by
# CONTAINERS_STORAGE_CONF, CONTAINERS_CONF and CONTAINERS_REGISTRIES_CONF, so the machine's own
# /etc/containers and /var/lib/containers are never read for settings or written.
#
# After sourcing: $cache (PD_IMAGES_CACHE, default ~/.cache/pd-operator-images), the three variables
# and TMPDIR exported.
cache=${PD_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator-images}
mkdir -p "$cache/storage" "$cache/run" "$cache/config/cni" "$cache/bin" "$cache/tmp"

# FILE: stdin written to FILE in one rename, so a podman started meanwhile never reads half a file.
write_config() {
  cat >"$1.$$" && mv "$1.$$" "$1"
}

# overlay on the ext4 root needs no fuse-overlayfs (docs/images.md).
write_config "$cache/config/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$cache/storage"
runroot = "$cache/run"
CONF

# runc, not crun: crun refuses this machine's hybrid cgroups. The ulimits stay under the hard limits a
# process without CAP_SYS_RESOURCE may set (else runc: "error setting rlimit type 7"). Host network only:
# a bridge would be created, and ip_forward turned on, in the machine's own network namespace.
# Every other path the engine would write under /run, /var/lib, /var/tmp or /etc/cni is moved here too,
# runc's state directory included (the runc wrapper's --root).
write_config "$cache/config/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[network]
network_config_dir = "$cache/config/cni"

[engine]
runtime = "runc"
tmp_dir = "$cache/run/libpod"
static_dir = "$cache/storage/libpod"
volume_path = "$cache/storage/volumes"
image_copy_tmp_dir = "$cache/tmp"
events_logger = "file"
events_logfile_path = "$cache/run/events.log"

[engine.runtimes]
runc = ["$cache/bin/runc"]
CONF
write_config "$cache/bin/runc.new" <<SH
#!/bin/sh
exec runc --root "$cache/run/runc" "\$@"
SH
chmod +x "$cache/bin/runc.new" && mv "$cache/bin/runc.new" "$cache/bin/runc"

# No search registries: every name is fully qualified and must already be in the private storage.
write_config "$cache/config/registries.conf" <<CONF
unqualified-search-registries = []
CONF

export CONTAINERS_STORAGE_CONF=$cache/config/storage.conf
export CONTAINERS_CONF=$cache/config/containers.conf
export CONTAINERS_REGISTRIES_CONF=$cache/config/registries.conf
# Large temporary files of image copies (skopeo, buildah commit).
export TMPDIR=$cache/tmp
