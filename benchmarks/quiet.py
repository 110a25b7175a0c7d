"""Measuring on a shared machine: CPU seconds per process from /proc, and attempts abandoned
(and started again) while other work keeps the cores busy."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tqdm import tqdm

from splitspec.launcher import LocalStack

T = TypeVar("T")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_cpu_s() -> float:
    """CPU seconds all processes on the machine have spent busy since boot, from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent in a window by the stack's processes, this process and everything else.

    "others" is the machine's busy time minus ours: other work sharing the cores, which makes
    the figures of that window pessimistic.
    """

    def __init__(self, stack: LocalStack | None) -> None:
        self.pids = {} if stack is None else {
            s.name: s.process.pid for s in stack.services() if s.process is not None}
        self.started = time.perf_counter()
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        now = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        return {**now, "benchmark": self_cpu_s(), "machine": machine_busy_cpu_s()}

    def elapsed(self) -> dict[str, float]:
        end = self._read()
        spent = {name: end[name] - self.start[name] for name in end}
        machine = spent.pop("machine")
        spent["others"] = max(0.0, machine - sum(spent.values()))
        return {name: round(value, 3) for name, value in spent.items()}

    def other_cores(self) -> float:
        return self.elapsed()["others"] / max(time.perf_counter() - self.started, 1e-6)


class Disturbed(Exception):
    """Other processes took more CPU than the QuietPolicy allows; the attempt is abandoned."""


@dataclass(frozen=True)
class QuietPolicy:
    """When a measurement counts: other processes kept at most max_other_cores busy meanwhile.

    On a shared machine an attempt that other work disturbs is abandoned and started again
    (up to max_attempts), each after waiting up to wait_timeout_s for the machine to go quiet;
    the last attempt is kept whatever happened. wait_timeout_s <= 0 neither waits nor samples.
    """

    max_other_cores: float = 0.25
    max_attempts: int = 5
    wait_timeout_s: float = 600.0
    sample_s: float = 5.0

    def check(self, meter: CpuMeter, may_abandon: bool) -> None:
        """Raises Disturbed when the attempt may be abandoned and other work has spoiled it."""
        if may_abandon and (busy := meter.other_cores()) > self.max_other_cores:
            raise Disturbed(f"other processes kept {busy:.2f} cores busy")


def other_cores_busy(sample_s: float) -> float:
    """Cores kept busy over `sample_s` by everything on the machine (ours should be idle)."""
    start = machine_busy_cpu_s()
    time.sleep(sample_s)
    return (machine_busy_cpu_s() - start) / sample_s


def wait_until_quiet(policy: QuietPolicy) -> None:
    deadline = time.monotonic() + policy.wait_timeout_s
    while time.monotonic() < deadline:
        if other_cores_busy(policy.sample_s) <= policy.max_other_cores:
            return


def measure_quietly(measure: Callable[[bool], T], policy: QuietPolicy) -> tuple[T, int]:
    """Calls measure(may_abandon) until an attempt is not abandoned; returns it and the count."""
    for attempt in range(1, policy.max_attempts):
        wait_until_quiet(policy)
        try:
            return measure(True), attempt
        except Disturbed as err:
            tqdm.write(f"attempt {attempt} abandoned: {err}")
    wait_until_quiet(policy)
    return measure(False), policy.max_attempts
