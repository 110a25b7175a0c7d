# Sourced: podman settings for this VM, kept under $W (nothing written to /etc). The two VM
# quirks (see /work/shared/reference/containers-in-ci.md): the capability set lacks
# CAP_SYS_RESOURCE, so ulimits must stay at the host's hard limits (nproc <= 32768, conmon's),
# and cgroup v1 with a hybrid v2 mount, which crun refuses: runc is used.
W=${SPLITSPEC_CI_DIR:-/var/tmp/splitspec-ci}
mkdir -p "$W"
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n' \
    "$(ulimit -Hn)" "$(ulimit -Hn)" > "$W/containers.conf"
printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' \
    "$W" "$W" > "$W/storage.conf"
export CONTAINERS_CONF="$W/containers.conf" CONTAINERS_STORAGE_CONF="$W/storage.conf"
