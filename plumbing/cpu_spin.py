"""Idle spinners: a busy process on each CPU at the lowest scheduling class, so no CPU halts.

Where the kernel has no cpuidle driver (the H200 box is a Firecracker VM without one), an idle
CPU halts, and PM QoS (plumbing/cpu_wake.py) has no idle state to forbid. A halted vCPU wakes
through its host, and each of a round's waits (1-2 ms) ends in such a wake-up: on that box a
gRPC echo whose handler works for 1 ms cost 0.42-0.64 ms beyond the work, 0.21-0.27 ms with
spinners, and a batch-1 EAGLE round fell from 4.6 to 3.8-3.9 ms (benchmarks/rpc_wake.py;
docs/gpu-history.md, "Idle spinners"). A runnable SCHED_IDLE process keeps its CPU out of the idle
loop yet gives way at once to any thread that wakes there: the wake-up becomes a preemption
inside the guest.

The cost is the whole machine busy: power, and CPU time billed where CPUs are metered. Under a
CPU quota (a container's cpu.max, a Kubernetes CPU limit) the spinners' time counts against the
quota and throttles the service, and an autoscaler reading CPU use sees a full load: they are
for machines a service has to itself. They spin only while the service works: after
``IDLE_AFTER_S`` in which its process tree spent next to no CPU (plumbing/cpu_activity.py) they
sleep, and wake within a poll or two of its next work (the first round or two of a request
after a quiet spell run without them). They run at nice 19, so that top and /proc/stat count
their time as "nice", apart from the service's. The spinners die with the process that started
them (PR_SET_PDEATHSIG), or at ``stop``.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import subprocess
import sys
import time

from plumbing.cpu_activity import ActivityWatch, TreeTicks
from plumbing.lifecycle import die_with_parent

log = logging.getLogger("splitspec.cpu_spin")

IDLE_AFTER_S = 2.0  # quiet time before the spinners sleep: a pause between requests is shorter
POLL_S = 0.1  # how often the first spinner reads the service's CPU time
SLEEP_S = 0.02  # how often a sleeping spinner looks whether to spin again

_started: list[subprocess.Popen] = []  # one spinner process each, with a child per extra CPU


def start(cpus: set[int] | None = None, idle_after_s: float = IDLE_AFTER_S) -> subprocess.Popen:
    """Spins on each CPU this process may run on (or on ``cpus``) while this process's tree
    works, until it exits."""
    chosen = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-m", "plumbing.cpu_spin", str(os.getpid()), ",".join(map(str, chosen)),
         str(idle_after_s)],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    _started.append(spinner)
    log.info("spinning at SCHED_IDLE on CPUs %s so that none halts (asleep after %.1f s idle)",
             ",".join(map(str, chosen)), idle_after_s)  # fmt: skip
    return spinner


def stop() -> None:
    """Ends the spinners ``start`` began (their children follow their parent)."""
    for spinner in _started:
        spinner.kill()
        spinner.wait()
    _started.clear()


def _take_cpu(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.nice(19)  # before the class: SCHED_IDLE keeps the nice value, which the accounting reads
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def spin_on(cpu: int, spinning: mmap.mmap) -> None:
    """Spins while the shared flag is set, else looks at it every SLEEP_S."""
    _take_cpu(cpu)
    while True:
        while spinning[0]:
            pass
        time.sleep(SLEEP_S)


def spin_and_watch(cpu: int, spinning: mmap.mmap, watch: ActivityWatch) -> None:
    """Spins (or sleeps while the service idles) and sets the flag from the service's CPU time
    every POLL_S."""
    _take_cpu(cpu)
    next_poll = 0.0
    while True:
        now = time.monotonic()
        if now >= next_poll:
            spinning[0] = int(watch.busy(now))
            next_poll = now + POLL_S
        if not spinning[0]:
            time.sleep(next_poll - now)


def main(parent: int, cpus: list[int], idle_after_s: float) -> None:
    """One process per CPU: this one spins on the first and watches the service, a forked
    child spins on each other one. They share the flag in an anonymous shared map. Nothing
    here imports gRPC, whose fork handlers would make the forks unsafe."""
    die_with_parent(parent, signal.SIGKILL, "cpu_spin: the service was gone")
    me = os.getpid()
    spinning = mmap.mmap(-1, 1)
    spinning[0] = 1  # a service that starts spinners is starting up: busy
    for cpu in cpus[1:]:
        if os.fork() == 0:
            die_with_parent(me, signal.SIGKILL, "cpu_spin: its parent was gone")
            spin_on(cpu, spinning)
    watch = ActivityWatch(TreeTicks(root=parent, leave_out=me), idle_after_s)
    spin_and_watch(cpus[0], spinning, watch)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(cpu) for cpu in sys.argv[2].split(",")], float(sys.argv[3]))
