"""The `splitspec` command as a user meets it: --version, each service alone under its name
(`splitspec router|target|draft`, their own --help), and a service on --port 0 that logs the
port it got, where it answers."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.processes import ngram_draft_process

pytestmark = pytest.mark.timeout(120)
SERVICES = ("router", "target", "draft")


def splitspec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "splitspec.cli", *args], capture_output=True,
                          text=True, timeout=90)  # fmt: skip


def test_version_is_the_installed_packages() -> None:
    try:
        expected = version("splitspec")  # installed (make install): pyproject's version
    except PackageNotFoundError:  # a checkout on PYTHONPATH, never installed (the GPU box)
        expected = "unknown (not installed)"
    done = splitspec("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"splitspec {expected}"


def test_each_service_runs_under_its_name_with_its_own_help() -> None:
    listed = splitspec("--help").stdout
    with ThreadPoolExecutor(len(SERVICES)) as pool:  # three torch imports at once
        runs = pool.map(lambda s: splitspec(s, "--help"), SERVICES)
        helps = dict(zip(SERVICES, runs, strict=True))
    for name, done in helps.items():
        assert re.search(rf"^    {name}\s+run (the|a) {name}", listed, re.MULTILINE), listed
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"usage: splitspec {name} "), done.stdout[:300]
        assert "--port PORT" in done.stdout


def test_a_service_on_port_0_logs_the_port_it_got(tmp_path: Path) -> None:
    log_path = tmp_path / "draft.log"
    with log_path.open("wb") as log:
        draft = subprocess.Popen(
            [sys.executable, "-m", "splitspec.cli", "draft", "--method", "ngram", "--port", "0"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        address = wait_for_address(log_path, draft)
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        draft.terminate()
        draft.wait(30)


def wait_for_address(log_path: Path, service: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and service.poll() is None:
        found = re.search(r"serving on (127\.0\.0\.1:(\d+))", log_path.read_text())
        if found:
            assert found.group(2) != "0", "the log names port 0, not the one bound"
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no 'serving on' line:\n{log_path.read_text()[-2000:]}")


def test_a_router_without_its_target_says_what_it_waits_for_and_gives_up() -> None:
    done = splitspec("router", "--port", "0", "--target", "127.0.0.1:1", "--target-wait-s", "1")
    assert done.returncode == 1
    assert "waiting for the target at 127.0.0.1:1 (up to 1 s)" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("router: target at 127.0.0.1:1 not healthy after 1 s (UNAVAILABLE"), last


def test_a_router_pointed_at_a_draft_says_it_is_not_a_target(tmp_path: Path) -> None:
    """It used to take the draft for a target (its plain health check passes) and die of an
    UNIMPLEMENTED GetInfo with a traceback."""
    draft = ngram_draft_process(tmp_path / "draft.log")
    draft.start()
    try:
        draft.wait_healthy(60)
        done = splitspec("router", "--port", "0", "--target", draft.address)
    finally:
        draft.stop()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"router: {draft.address} is not a target service"), last
