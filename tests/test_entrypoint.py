"""The images' entrypoint (deploy/entrypoint.py): flags from $SPLITSPEC_ARGS_FILE (the Helm
chart's ConfigMap) reach the service, before the command line's, and bad use says how."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.py"


def run(args: list[str], args_file: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPLITSPEC_ARGS_FILE"}
    if args_file is not None:
        env["SPLITSPEC_ARGS_FILE"] = str(args_file)
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_flags_from_the_file_reach_the_router(tmp_path: Path) -> None:
    flags = tmp_path / "router.args"
    flags.write_text("# from a ConfigMap\n--port 1234 --draft-dns 'no port here'\n")
    done = run(["router"], flags)
    assert done.returncode == 2
    assert "--draft-dns wants HOST:PORT, got 'no port here'" in done.stderr


def test_command_line_flags_come_after_the_file(tmp_path: Path) -> None:
    flags = tmp_path / "router.args"
    flags.write_text("--draft-dns bad")
    done = run(["router", "--max-queue", "not-a-number"], flags)
    assert done.returncode == 2 and "HOST:PORT" in done.stderr  # the file's flag parsed first


def test_an_unknown_service_is_refused() -> None:
    done = run(["trainer"])
    assert done.returncode == 1 and "usage: splitspec-entrypoint" in done.stderr
