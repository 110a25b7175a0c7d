"""The README's first command, minus the install: `splitspec serve --demo` as a user runs it.

A real subprocess starts the default stack (target, router, EAGLE draft replica with the
shipped head, --dtype auto), streams the demo generation and exits; its output must show the
generation, its speed and its acceptance, and no service may outlive it.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_serve_demo_shows_speed_and_acceptance() -> None:
    command = [
        sys.executable,
        "-m",
        "splitspec.cli",
        "serve",
        "--demo",
        "--demo-tokens",
        "40",
        "--exit-after-demo",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "draft  (internal, splitspec.draft.v1.DraftModel, eagle)" in out
    summary = re.search(r"(\d+) tokens in [\d.]+ s = ([\d.]+) tok/s", out)
    assert summary and int(summary.group(1)) > 0 and float(summary.group(2)) > 0, out
    acceptance = re.search(r"acceptance ([\d.]+) tokens/step", out)
    assert acceptance and float(acceptance.group(1)) >= 1.0, out
    ports = re.findall(r"^(?:router|target|draft) .*: 127\.0\.0\.1:(\d+)$", out, re.MULTILINE)
    assert len(ports) == 3, out  # router, target, draft
    assert not [p for p in ports if services_on(p)], "a service outlived splitspec serve"


def services_on(port: str) -> list[str]:
    """Command lines of live processes started with --port PORT."""
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if f"--port {port}" in line]
