"""Short-lived commands of one test module started together: each imports torch for a second or
two before it refuses something, so on CI's two cores running them side by side halves the wait
that one after another would cost. A test asks for its command's result by name."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

TIMEOUT_S = 90


class Commands:
    def __init__(self, commands: Mapping[str, Sequence[str]]) -> None:
        self._running = {
            name: subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
            for name, args in commands.items()
        }
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def result(self, name: str) -> subprocess.CompletedProcess:
        if name not in self._done:
            process = self._running[name]
            out, err = process.communicate(timeout=TIMEOUT_S)
            self._done[name] = subprocess.CompletedProcess(process.args, process.returncode,
                                                           out, err)  # fmt: skip
        return self._done[name]

    def stop(self) -> None:
        for process in self._running.values():
            if process.poll() is None:
                process.kill()
            process.communicate()


@contextmanager
def started_together(commands: Mapping[str, Sequence[str]]) -> Iterator[Commands]:
    """``python -m ARGS...`` for each name, all started at once; any left are killed on exit."""
    batch = Commands(commands)
    try:
        yield batch
    finally:
        batch.stop()
