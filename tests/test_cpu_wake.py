"""--keep-cpus-awake (plumbing/cpu_wake.py): a real router holds the system's PM QoS limit at
0 us while it runs and drops it when it exits; without access it warns and serves anyway; with
``spin`` it keeps a SCHED_IDLE spinner on each CPU, which sleep while it idles, spin while it
works, and die with it; ``auto`` picks qos only where a cpuidle driver would obey it and the
device is writable."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plumbing import cpu_wake
from splitspec.launcher import free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
HELD_LINE = "CPU idle exit latency held at 0 us"


def _writable_pm_qos() -> bool:
    return os.access(cpu_wake.PM_QOS_DEVICE, os.W_OK)


def _start_router(mode: str, log_path: Path) -> subprocess.Popen:
    """A router with ``--keep-cpus-awake MODE``, logging to ``log_path``; its target is never
    reached (the router starts without it)."""
    port, unused = free_ports(2)
    with log_path.open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "router", "--keep-cpus-awake", mode, "--host", "127.0.0.1",
             "--port", str(port), "--target", f"127.0.0.1:{unused}"],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.skipif(not _writable_pm_qos(), reason=f"{cpu_wake.PM_QOS_DEVICE} is not writable "
                    "here (needs root and the device), so no limit can be held")  # fmt: skip
def test_a_router_with_the_flag_holds_the_limit_until_it_exits(tmp_path: Path) -> None:
    before = cpu_wake.current_limit_us()
    if before == 0:
        pytest.skip("another process holds the limit at 0 already: the router's would not show")
    log_path = tmp_path / "router.log"
    router = _start_router("qos", log_path)
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


def _spinners_of(ancestor: int) -> list[int]:
    """Pids of the cpu_spin processes descended from ``ancestor``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = (int(fields[1]), b"plumbing.cpu_spin" in cmdline)

    def descends(pid: int) -> bool:
        while pid in parents and pid != ancestor:
            pid = parents[pid][0]
        return pid == ancestor

    return [pid for pid, (_, spins) in parents.items() if spins and descends(pid)]


def _share_runnable(pids: list[int], samples: int = 20) -> float:
    """Of 20 looks at the processes over 0.2 s, the share that found one runnable ('R'): a
    spinner is always, a sleeping one only while it wakes to look at its flag."""
    runnable = 0
    for _ in range(samples):
        for pid in pids:
            runnable += Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
        time.sleep(0.01)
    return runnable / (samples * len(pids))


def _wait_until(spinning: bool, pids: list[int], why: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while ((share := _share_runnable(pids)) == 1.0) != spinning or 0 < share < 0.5:
        assert time.monotonic() < deadline, f"{why}: runnable in {share:.0%} of the looks"


def test_a_router_spinning_keeps_an_idle_class_spinner_per_cpu_and_they_die_with_it(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "router.log"
    router = _start_router("spin", log_path)
    cpus = os.sched_getaffinity(0)
    try:
        deadline = time.monotonic() + 60
        while len(spinners := _spinners_of(router.pid)) < len(cpus):
            assert router.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, (spinners, log_path.read_text()[-2000:])
            time.sleep(0.2)
        deadline = time.monotonic() + 30  # each sets its class and CPU first thing
        while {os.sched_getscheduler(pid) for pid in spinners} != {os.SCHED_IDLE}:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert sorted(cpu for pid in spinners for cpu in os.sched_getaffinity(pid)) == sorted(cpus)
        assert {os.getpriority(os.PRIO_PROCESS, pid) for pid in spinners} == {19}
        assert "so that none halts" in log_path.read_text()
        # A router waiting for its target does next to nothing: 2 s after start-up they sleep.
        _wait_until(False, spinners, "the spinners of an idle router kept spinning")
    finally:
        router.kill()  # no clean exit: the kernel's parent-death signal takes them
        router.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in spinners):
        assert time.monotonic() < deadline, "spinners outlived the router"
        time.sleep(0.1)


# A service's stand-in whose work the test sets: it starts the spinners (asleep after 1 s of
# quiet), then busy-loops for as long as each line on its stdin says.
WORKER = """
import sys, time
from plumbing import cpu_spin
cpu_spin.start(idle_after_s=1.0)
print("started", flush=True)
for line in sys.stdin:
    end = time.monotonic() + float(line)
    while time.monotonic() < end:
        pass
    print("done", flush=True)
"""


# SCHED_IDLE spinners starve beside any other work: alone, after the container stack is gone.
@pytest.mark.serial
def test_spinners_spin_while_their_service_works_and_sleep_once_it_idles() -> None:
    worker = subprocess.Popen([sys.executable, "-c", WORKER], cwd=REPO_ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None
    try:
        assert worker.stdout.readline() == "started\n"
        deadline = time.monotonic() + 60
        while len(spinners := _spinners_of(worker.pid)) < len(os.sched_getaffinity(0)):
            assert time.monotonic() < deadline, spinners
            time.sleep(0.2)
        _wait_until(False, spinners, "idle from the start, the spinners kept spinning")
        worker.stdin.write("4\n")
        worker.stdin.flush()
        # A poll or two (0.1-0.2 s alone on the dev box).
        _wait_until(True, spinners, "the spinners slept while the service worked", 2.0)
        time.sleep(0.3)
        assert _share_runnable(spinners) == 1.0, "the spinners stopped while the service worked"
        assert worker.stdout.readline() == "done\n"
        _wait_until(False, spinners, "the spinners went on spinning once the service idled", 10)
    finally:
        worker.kill()
        worker.wait(timeout=30)


def test_auto_picks_qos_only_with_a_cpuidle_driver_and_a_writable_device(tmp_path: Path) -> None:
    driver, device = tmp_path / "current_driver", tmp_path / "cpu_dma_latency"
    device.write_bytes(b"\0" * 4)
    driver.write_text("haltpoll\n")
    assert cpu_wake.choose_mode(str(driver), str(device)) == "qos"
    assert cpu_wake.choose_mode(str(driver), str(tmp_path / "missing")) == "spin"
    driver.write_text("none\n")  # a halting kernel: the limit has no idle state to forbid
    assert cpu_wake.choose_mode(str(driver), str(device)) == "spin"
    assert cpu_wake.choose_mode(str(tmp_path / "no-cpuidle"), str(device)) == "spin"


def test_every_service_and_serve_take_the_flag() -> None:
    for module in ("router", "target_service", "draft_service"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "--keep-cpus-awake" in done.stdout, module
    done = subprocess.run([sys.executable, "-m", "splitspec.cli", "serve", "--help"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "--keep-cpus-awake" in done.stdout
