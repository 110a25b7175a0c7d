"""``--keep-cpus-awake``: holds the CPUs out of their deep idle states while a service runs.

A speculative round is a chain of short waits: the router waits for a Verify, the target's
handler thread for the next request, the drafter for its Propose. Each wait long enough for a
core to go idle ends in a wake-up out of an idle state, paid by every thread hand-off of
every RPC, and dearer on a virtual machine (a halted vCPU wakes through its host). Linux's PM QoS interface takes a latency limit for as long as
a file descriptor on ``/dev/cpu_dma_latency`` stays open; 0 keeps idle cores polling instead
(the "latency-performance" profile of tuned does the same for a whole machine).

What it changes is measured by ``python -m benchmarks.rpc_wake`` (README, "Speculative
decoding"): on the 2-core dev VM a round-like call's overhead fell by a third; on the H200 box,
which exposes no idle states, nothing changed. The cost: idle cores spin, so the machine draws more power and a VM's vCPUs use
their host's CPU time while idle. Off by default for that reason.

The limit is system-wide and needs write access to the device (root, or a container given
the device): where that is missing the service says so in one line and runs as it would
without the flag.
"""

from __future__ import annotations

import argparse
import logging
import os
import struct

log = logging.getLogger("splitspec.cpu_wake")

PM_QOS_DEVICE = "/dev/cpu_dma_latency"
_held: list[int] = []  # descriptors kept open for the life of the process


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="hold the CPUs out of deep idle states while this process runs (PM QoS "
        f"{PM_QOS_DEVICE} = 0): cheaper RPC wake-ups, more power drawn; needs write access "
        "to the device, else a warning and no change",
    )


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
