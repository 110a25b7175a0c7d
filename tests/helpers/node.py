"""The Node.js client (clients/node) for the tests that run it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
NO_NODE = shutil.which("node") is None or shutil.which("npm") is None
NO_NODE_REASON = "node and npm are not installed on this machine"


def npm_installed() -> Path:
    """Installs the locked npm packages once (a few seconds from the registry)."""
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=NODE_DIR, check=True, timeout=180)  # fmt: skip
    return NODE_DIR
