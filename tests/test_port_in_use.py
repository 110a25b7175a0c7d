"""A port in use stops a service with a clear error; it is never shared.

gRPC servers bind with SO_REUSEPORT by default: a second service on a busy port used to bind
as well, and the kernel then split new connections between the two (a stale target from an
earlier run would answer half of a new router's calls). Real processes on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from plumbing.grpc_util import wait_healthy
from tests.helpers.processes import ngram_draft_process

pytestmark = pytest.mark.timeout(120)
EXIT_WITHIN_S = 60.0  # a draft service imports torch before it binds: seconds on a loaded box


def test_a_second_service_on_a_busy_port_exits_saying_so(tmp_path: Path) -> None:
    first = ngram_draft_process(tmp_path / "first.log", name="first")
    port = int(first.address.rsplit(":", 1)[1])
    second = ngram_draft_process(tmp_path / "second.log", port, "second")
    first.start()
    try:
        first.wait_healthy(60)
        second.start()
        assert second.process is not None
        code = second.process.wait(EXIT_WITHIN_S)
        log = (tmp_path / "second.log").read_text()
        assert code != 0
        assert f"cannot bind 127.0.0.1:{port}: the port is in use" in log, log[-2000:]
        assert wait_healthy(first.address, timeout_s=5.0), "the first service stopped serving"
    finally:
        second.stop()
        first.stop()


def test_serve_on_a_busy_port_stops_before_starting_anything() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "splitspec.cli", "serve", "--port", str(port), "--demo"],
            capture_output=True, text=True, timeout=EXIT_WITHIN_S,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"port {port} of 127.0.0.1 is in use" in done.stderr
    assert "--port" in done.stderr
    assert "starting target" not in done.stdout and "model:" not in done.stdout
