#!/bin/sh
# pip install, offline from the wheelhouse when one is mounted at /wheels, else online.
if ls /wheels/*.whl >/dev/null 2>&1; then
    set -- --no-index --find-links /wheels "$@"
fi
exec pip install --quiet "$@"
