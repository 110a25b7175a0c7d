"""Default locations, read once at start-up by the command line."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where converted checkpoints are cached: $SPLITSPEC_CACHE or ~/.cache/splitspec."""
    root = os.environ.get("SPLITSPEC_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "splitspec"
