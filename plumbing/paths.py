"""Default locations, read once at start-up by the command line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where converted checkpoints are cached: $SPLITSPEC_CACHE or ~/.cache/splitspec."""
    root = os.environ.get("SPLITSPEC_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "splitspec"


def add_cache_dir_flag(group: argparse._ActionsContainer) -> None:
    """--cache-dir, as every command that converts or loads a checkpoint takes it."""
    group.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="converted-checkpoint cache (default: $SPLITSPEC_CACHE, else "
        "$XDG_CACHE_HOME/splitspec, else ~/.cache/splitspec)",
    )
