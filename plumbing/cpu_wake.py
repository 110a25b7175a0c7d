"""``--keep-cpus-awake``: keeps the CPUs out of idle states while a service runs.

A speculative round is a chain of short waits: the router waits for a Verify, the target's
handler thread for the next request, the drafter for its Propose. Each wait long enough for a
core to go idle ends in a wake-up out of an idle state, paid by every thread hand-off of
every RPC, and dearer on a virtual machine (a halted vCPU wakes through its host). Two ways
to keep them awake:

- ``qos``: Linux's PM QoS interface takes a latency limit for as long as a file descriptor on
  ``/dev/cpu_dma_latency`` stays open; 0 keeps idle cores polling in the cpuidle driver's
  poll state (the "latency-performance" profile of tuned does the same for a whole machine).
  It needs write access to the device (root, or a container given it), and a cpuidle driver:
  without one an idle CPU halts whatever the limit.
- ``spin``: a busy SCHED_IDLE process on every CPU (plumbing/cpu_spin.py), which any waking
  thread preempts at once. No privilege needed; never under a CPU quota.
- ``auto`` (the flag alone): ``qos`` where the kernel has a cpuidle driver and the device is
  writable, else ``spin``.

Measured by ``python -m benchmarks.rpc_wake`` (docs/speculation.md, "Keeping the CPUs awake";
the H200 rounds in docs/gpu-history.md, "Idle spinners"): on the 2-core dev VM (cpuidle driver
haltpoll) ``qos`` cut a round-like call's overhead by a third; on the
H200 box (no cpuidle driver) ``qos`` changed nothing and ``spin`` halved it, and a batch-1
EAGLE round fell from 4.6 to 3.8-3.9 ms. The cost either way: idle cores keep running
(``qos`` for the life of the process, ``spin`` while the service works), so the machine
draws more power and a VM's vCPUs use their host's CPU time. Off by default.
"""

from __future__ import annotations

import argparse
import logging
import os
import struct

from plumbing import cpu_spin

log = logging.getLogger("splitspec.cpu_wake")

PM_QOS_DEVICE = "/dev/cpu_dma_latency"
CPUIDLE_DRIVER = "/sys/devices/system/cpu/cpuidle/current_driver"
MODES = ("auto", "qos", "spin")
_held: list[int] = []  # descriptors kept open for the life of the process


def add_argument(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--keep-cpus-awake",
        nargs="?",
        const="auto",
        choices=MODES,
        metavar="{auto,qos,spin}",
        help="keep the CPUs out of idle states while this process runs, for cheaper RPC "
        f"wake-ups at the cost of power: qos holds PM QoS {PM_QOS_DEVICE} at 0 (needs write "
        "access and a cpuidle driver), spin runs a SCHED_IDLE busy process on every CPU "
        "(not under a CPU quota); auto (the flag alone) picks qos where it can work",
    )


def apply(mode: str | None) -> None:
    """What a service does with its ``--keep-cpus-awake`` (None: the flag was not given)."""
    if mode == "auto":
        mode = choose_mode()
    if mode == "qos":
        keep_cpus_awake()
    elif mode == "spin":
        cpu_spin.start()


def choose_mode(driver_file: str = CPUIDLE_DRIVER, device: str = PM_QOS_DEVICE) -> str:
    """qos where it can work (a cpuidle driver to obey the limit, write access to set it)."""
    try:
        with open(driver_file) as f:
            driver = f.read().strip()
    except OSError:
        driver = "none"
    return "qos" if driver != "none" and os.access(device, os.W_OK) else "spin"


def keep_cpus_awake(device: str = PM_QOS_DEVICE) -> bool:
    """Asks for an idle exit latency of 0 us until this process exits; False (a warning
    logged) where the request cannot be made."""
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as err:
        log.warning("--keep-cpus-awake: cannot open %s (%s); CPUs may idle deeply", device, err)
        return False
    try:
        os.write(fd, struct.pack("=i", 0))
    except OSError as err:
        os.close(fd)
        log.warning("--keep-cpus-awake: cannot write %s (%s); CPUs may idle deeply", device, err)
        return False
    _held.append(fd)  # closing it (at exit) drops the request
    log.info("--keep-cpus-awake: CPU idle exit latency held at 0 us (%s)", device)
    return True


def current_limit_us(device: str = PM_QOS_DEVICE) -> int:
    """The system's current limit (the smallest request held), as the device reads back."""
    with open(device, "rb") as f:
        (value,) = struct.unpack("=i", f.read(4))
    return value
