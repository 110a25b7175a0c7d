"""Single service processes for tests that start, signal and stop one service by hand."""

from __future__ import annotations

from pathlib import Path

from splitspec.launcher import ServiceProcess, free_ports, python_module


def ngram_draft_process(log_path: Path) -> ServiceProcess:
    """An n-gram draft service on a free loopback port (not started)."""
    (port,) = free_ports(1)
    return ServiceProcess(
        "draft",
        python_module("draft_service", "--method", "ngram", "--port", str(port)),
        f"127.0.0.1:{port}",
        log_path,
    )
