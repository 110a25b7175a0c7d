"""Whether a service is at work, from the CPU time its process tree spends (read from /proc).

The idle spinners (plumbing/cpu_spin.py) spin only while the service that started them works:
a serving stack's processes spend a large share of a CPU (a batch-1 GPU round keeps the target
busy in its device sync, a CPU stack keeps every core busy), an idle one next to nothing. So no
signal is needed from the services' hot paths; the spinners watch their parent's process tree
(without themselves) and stop after a quiet spell.

The process table is scanned for the tree (this kernel has no /proc/PID/task/TID/children) only
every few seconds; in between only the tree's own stat files are read, a few hundred us.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")


def read_stat(pid: int, proc: Path = PROC) -> tuple[int, int] | None:
    """(parent pid, user + system clock ticks) of a process, None when it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name before ")" may hold spaces
    return int(fields[1]), int(fields[11]) + int(fields[12])


def descendants(root: int, leave_out: int, proc: Path = PROC) -> set[int]:
    """``root`` and every process below it, without ``leave_out`` and the processes below it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir(proc):
        if entry.name.isdigit() and (stat := read_stat(int(entry.name), proc)) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid != leave_out and pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


class TreeTicks:
    """CPU ticks a process tree spends between calls (a process seen for the first time
    counts from then on, so a long-lived one found at a rescan adds nothing at once)."""

    def __init__(self, root: int, leave_out: int, rescan_s: float = 2.0, proc: Path = PROC):
        self.root, self.leave_out, self.rescan_s, self.proc = root, leave_out, rescan_s, proc
        self._members: set[int] = set()
        self._ticks: dict[int, int] = {}
        self._next_scan = float("-inf")

    def spent_since_last(self, now: float) -> int:
        if now >= self._next_scan:
            self._members = descendants(self.root, self.leave_out, self.proc)
            self._next_scan = now + self.rescan_s
        spent, ticks = 0, {}
        for pid in self._members:
            stat = read_stat(pid, self.proc)
            if stat is not None:
                ticks[pid] = stat[1]
                spent += max(0, stat[1] - self._ticks.get(pid, stat[1]))
        self._ticks = ticks
        return spent


class ActivityWatch:
    """Busy from a poll where the tree spent at least ``min_ticks`` until ``idle_after_s``
    passes without one. With 100 ticks a second, 2 ticks in a 0.1 s poll is a fifth of a CPU:
    a serving stack passes it many times a second, an idle one almost never."""

    def __init__(
        self, ticks: TreeTicks, idle_after_s: float, min_ticks: int = 2, now: float | None = None
    ) -> None:
        self.ticks, self.idle_after_s, self.min_ticks = ticks, idle_after_s, min_ticks
        # Busy from the start (``now``): a service starting spinners is starting up.
        self._last_busy = time.monotonic() if now is None else now

    def busy(self, now: float) -> bool:
        if self.ticks.spent_since_last(now) >= self.min_ticks:
            self._last_busy = now
        return now - self._last_busy < self.idle_after_s
