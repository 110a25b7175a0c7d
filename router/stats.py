"""Server-wide counters reported by GetServerStatus."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ServerCounters:
    started: float = field(default_factory=time.monotonic)
    num_finished: int = 0
    num_generated_tokens: int = 0

    def record_finish(self, completion_tokens: int) -> None:
        self.num_finished += 1
        self.num_generated_tokens += completion_tokens

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started
