"""Single service processes for tests that start, signal and stop one service by hand, and the
processes a launcher left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from plumbing.lifecycle import PARENT_PID_ENV
from splitspec.launcher import ServiceProcess, free_ports, python_module


def ngram_draft_process(log_path: Path, port: int = 0, name: str = "draft") -> ServiceProcess:
    """An n-gram draft service on loopback ``port`` (0: a free one), not started."""
    port = port or free_ports(1)[0]
    return ServiceProcess(
        name,
        python_module("draft_service", "--method", "ngram", "--port", str(port)),
        f"127.0.0.1:{port}",
        log_path,
    )


def started_by(launcher_pid: int) -> list[str]:
    """Command lines of live processes that the launcher in process ``launcher_pid`` started
    (their environment names it, plumbing/lifecycle.py). Not matched by port: serve's router
    has a fixed one (50051), which another stack on the machine (a compose router) may use."""
    mark = f"{PARENT_PID_ENV}={launcher_pid}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue  # gone meanwhile, or another user's
    return [c.decode(errors="replace") for c in found]


def serve_until_serving(
    flags: list[str], out_path: Path, timeout_s: float = 120
) -> subprocess.Popen:
    """`splitspec serve FLAGS`, its output in ``out_path``, once it says it is serving; the
    caller stops it (killed here if it never does)."""
    command = [sys.executable, "-m", "splitspec.cli", "serve", *flags]
    with out_path.open("w") as out:
        serve = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        while "serving; Ctrl-C" not in out_path.read_text():
            assert serve.poll() is None, out_path.read_text()[-3000:]
            assert time.monotonic() < deadline, out_path.read_text()[-3000:]
            time.sleep(0.1)
    except BaseException:
        serve.kill()
        serve.wait()
        raise
    return serve
