#!/usr/bin/env bash
# What the container test needs on a fresh Debian 12 CI machine (as root): podman and
# debootstrap from Debian, podman-compose from PyPI in its own venv under $W.
set -euo pipefail
W=${SPLITSPEC_CI_DIR:-/var/tmp/splitspec-ci}
t0=$SECONDS
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends podman crun runc conmon netavark \
        aardvark-dns slirp4netns fuse-overlayfs uidmap iptables catatonit debootstrap >/dev/null
fi
if [ ! -x "$W/venv/bin/podman-compose" ]; then
    mkdir -p "$W"
    python3 -m venv "$W/venv"
    "$W/venv/bin/pip" install --quiet podman-compose==1.6.0
fi
echo "[install-podman] $(podman --version), podman-compose 1.6.0: $((SECONDS - t0)) s" >&2
