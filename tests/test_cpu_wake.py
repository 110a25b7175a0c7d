"""--keep-cpus-awake (splitspec/cpu_wake.py): a real router holds the system's PM QoS limit at
0 us while it runs and drops it when it exits; without access it warns and serves anyway."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitspec import cpu_wake
from splitspec.launcher import free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
HELD_LINE = "CPU idle exit latency held at 0 us"


def _writable_pm_qos() -> bool:
    return os.access(cpu_wake.PM_QOS_DEVICE, os.W_OK)


@pytest.mark.skipif(not _writable_pm_qos(), reason=f"{cpu_wake.PM_QOS_DEVICE} is not writable "
                    "here (needs root and the device), so no limit can be held")  # fmt: skip
def test_a_router_with_the_flag_holds_the_limit_until_it_exits(tmp_path: Path) -> None:
    before = cpu_wake.current_limit_us()
    if before == 0:
        pytest.skip("another process holds the limit at 0 already: the router's would not show")
    port, unused = free_ports(2)  # the target is never reached: the router starts without it
    log_path = tmp_path / "router.log"
    with log_path.open("w") as log:
        router = subprocess.Popen(
            [sys.executable, "-m", "router", "--keep-cpus-awake", "--host", "127.0.0.1",
             "--port", str(port), "--target", f"127.0.0.1:{unused}"],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while HELD_LINE not in log_path.read_text():
            assert router.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.2)
        assert cpu_wake.current_limit_us() == 0
    finally:
        router.terminate()
        router.wait(timeout=30)
    assert cpu_wake.current_limit_us() == before  # the request went with the process


def test_without_the_device_it_warns_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "cpu_dma_latency"
    with caplog.at_level(logging.WARNING, logger="splitspec.cpu_wake"):
        assert cpu_wake.keep_cpus_awake(str(missing)) is False
    assert "cannot open" in caplog.text and str(missing) in caplog.text
    assert not missing.exists()


def test_every_service_and_serve_take_the_flag() -> None:
    for module in ("router", "target_service", "draft_service"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "--keep-cpus-awake" in done.stdout, module
    done = subprocess.run([sys.executable, "-m", "splitspec.cli", "serve", "--help"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "--keep-cpus-awake" in done.stdout
