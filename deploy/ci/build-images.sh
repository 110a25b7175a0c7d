#!/usr/bin/env bash
# Builds every image from scratch with podman, no registry: a Debian base made with
# debootstrap from the apt mirror, then the router and model images from deploy/Containerfile
# with the wheelhouse (deploy/build-wheelhouse.sh). Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/ci/podman-env.sh
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=localhost/splitspec-base:bookworm
step() { local t0=$SECONDS; "$@"; echo "[build-images] $(printf '%q ' "$@" | cut -c1-60) took $((SECONDS - t0)) s" >&2; }

# What debootstrap mounted inside the tree it builds (proc, sys; /dev bound from the host when
# it runs in a container) stays mounted when it is killed. A later `rm -rf` would then fail on
# proc and sys, or delete the host's device nodes through that /dev. So the mounts go first,
# deepest first, and rm never crosses into a mount it missed.
unmount_under() {  # dir
    awk -v root="$1/" 'index($2, root) == 1 {print $2}' /proc/self/mounts | sort -r \
        | while read -r mount; do umount -l "$mount" || true; done
}

remove_rootfs() {
    unmount_under "$W/rootfs"
    rm -rf --one-file-system "$W/rootfs"
}

base() {
    remove_rootfs
    trap remove_rootfs EXIT  # an interrupted build leaves nothing mounted
    # Plain minbase: debootstrap resolving --include=python3 took 3x longer than apt in the build.
    debootstrap --variant=minbase bookworm "$W/rootfs" "$MIRROR" >"$W/debootstrap.log" 2>&1 \
        || { tail -20 "$W/debootstrap.log" >&2; return 1; }
    rm -rf "$W/rootfs/var/cache/apt/archives/"*.deb "$W/rootfs/var/lib/apt/lists/"*
    tar -C "$W/rootfs" -c . | podman import -q - "$BASE" >/dev/null
    remove_rootfs
    trap - EXIT
}

build() {  # target tag
    podman build -q --format docker --layers -f deploy/Containerfile --target "$1" \
        --build-arg BASE_IMAGE="$BASE" -t "$2" . >/dev/null
}

if [ -z "${KEEP_BASE:-}" ] || ! podman image exists "$BASE"; then step base; fi
# Every time: pip skips the wheels already there, and a wheelhouse from an older pyproject gets
# the dependencies added since (the router's OpenTelemetry ones were missing from one).
step deploy/build-wheelhouse.sh
step build python localhost/splitspec-python:0.1.0  # the shared stage, once
# Both images at once: one mostly unpacks wheels while the other commits layers.
step build router localhost/splitspec-router:0.1.0 &
router=$!
step build model localhost/splitspec-model:0.1.0
wait "$router"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep splitspec >&2
# The images this build replaced, untagged now: on a machine that runs CI again and again (the
# dev box) they filled the disk (24 GB after a day of runs).
podman image prune -f >/dev/null
