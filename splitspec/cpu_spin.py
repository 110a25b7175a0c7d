"""Idle spinners: a busy process on each CPU at the lowest scheduling class, so no CPU halts.

Where the kernel has no cpuidle driver (the H200 box is a Firecracker VM without one), an idle
CPU halts, and PM QoS (splitspec/cpu_wake.py) has no idle state to forbid. A halted vCPU wakes
through its host, and each of a round's waits (1-2 ms) ends in such a wake-up: on that box a
gRPC echo whose handler works for 1 ms cost 0.42-0.64 ms beyond the work, 0.21-0.27 ms with
spinners, and a batch-1 EAGLE round fell from 4.6 to 3.8-3.9 ms (benchmarks/rpc_wake.py;
README, "Speculation on the GPU"). A runnable SCHED_IDLE process keeps its CPU out of the idle
loop yet gives way at once to any thread that wakes there: the wake-up becomes a preemption
inside the guest.

The cost is the whole machine busy: power, and CPU time billed where CPUs are metered. Under a
CPU quota (a container's cpu.max, a Kubernetes CPU limit) the spinners' time counts against the
quota and throttles the service, and an autoscaler reading CPU use sees a full load: they are
for machines a service has to itself. The spinners die with the process that started them
(PR_SET_PDEATHSIG), or at ``stop``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from splitspec.lifecycle import die_with_parent

log = logging.getLogger("splitspec.cpu_spin")

_started: list[subprocess.Popen] = []  # one spinner process each, with a child per extra CPU


def start(cpus: set[int] | None = None) -> subprocess.Popen:
    """Spins on each CPU this process may run on (or on ``cpus``) until it exits."""
    chosen = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-m", "splitspec.cpu_spin", str(os.getpid()), ",".join(map(str, chosen))],
        stdin=subprocess.DEVNULL,
    )
    _started.append(spinner)
    log.info("spinning at SCHED_IDLE on CPUs %s so that none halts", ",".join(map(str, chosen)))
    return spinner


def stop() -> None:
    """Ends the spinners ``start`` began (their children follow their parent)."""
    for spinner in _started:
        spinner.kill()
        spinner.wait()
    _started.clear()


def spin_on(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        pass


def main(parent: int, cpus: list[int]) -> None:
    """One process per CPU: this one spins on the first, a forked child on each other one.
    Nothing here imports gRPC, whose fork handlers would make the forks unsafe."""
    die_with_parent(parent, signal.SIGKILL, "cpu_spin: the service was gone")
    me = os.getpid()
    for cpu in cpus[1:]:
        if os.fork() == 0:
            die_with_parent(me, signal.SIGKILL, "cpu_spin: its parent was gone")
            spin_on(cpu)
    spin_on(cpus[0])


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(cpu) for cpu in sys.argv[2].split(",")])
