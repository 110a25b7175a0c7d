#!/usr/bin/env bash
# CI: starts deploy/ci/build-images.sh in the background and prints its status folder (for
# SPLITSPEC_IMAGE_BUILD). The build is mostly downloads, unpacking and layer commits, so it
# overlaps `make install` and the first tests instead of holding up tests/test_compose.py,
# which waits for it and fails with its log if it failed. The folder gets `log`, then `rc`.
# At nice 19 it takes only CPU that the tests leave idle: at equal priority it slowed the
# first tests (cold starts, the benchmark smoke test) to half speed. The container test
# runs last (`make test`'s second, serial pytest run), so a slower build holds nothing up.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/ci/podman-env.sh
out="$W/image-build"
rm -rf "$out"
mkdir -p "$out"
# The wheelhouse needs a pip before .venv exists: podman-compose's venv (install-podman.sh).
PYTHON="$W/venv/bin/python" setsid nohup nice -n 19 bash -c \
    'deploy/ci/build-images.sh >"$1/log" 2>&1; echo $? >"$1/rc"' _ "$out" \
    </dev/null >/dev/null 2>&1 &
echo "$out"
