"""Small tmpfs mounts for tests of a cache folder that is read-only or full."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, read_only: bool = False, size: str = "1m") -> Iterator[Path]:
    """Mounts a tmpfs of ``size`` at ``folder`` (read-only if asked) for the block's length.

    Needs the right to mount (root, as CI and the dev machines run): where the kernel refuses,
    the test is skipped and says so.
    """
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
