#!/usr/bin/env python3
"""Container entrypoint: `splitspec-entrypoint router|target|draft [FLAGS...]`.

Flags also come from the file named by $SPLITSPEC_ARGS_FILE (shell-quoted, e.g. a Kubernetes
ConfigMap key); they go first, so flags on the command line win. The service replaces this
process (exec), so it is PID 1 and gets SIGTERM itself, and drains on it.
"""

import os
import shlex
import sys

MODULES = {"router": "router", "target": "target_service", "draft": "draft_service"}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in MODULES:
        sys.exit(f"usage: splitspec-entrypoint {{{'|'.join(MODULES)}}} [FLAGS...]")
    service, flags = sys.argv[1], sys.argv[2:]
    args_file = os.environ.get("SPLITSPEC_ARGS_FILE")
    if args_file:
        with open(args_file) as f:
            flags = shlex.split(f.read(), comments=True) + flags
    os.execv(sys.executable, [sys.executable, "-m", MODULES[service], *flags])


if __name__ == "__main__":
    main()
