"""Server-wide counters reported by GetServerStatus."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from protos import generation_pb2 as pb


def speculation_stats(
    verify_steps: int, draft_tokens: int, accepted_tokens: int
) -> pb.SpeculationStats:
    """Acceptance length counts committed tokens per verify step: accepted drafts + the bonus."""
    mean = (accepted_tokens + verify_steps) / verify_steps if verify_steps else 0.0
    return pb.SpeculationStats(
        verify_steps=verify_steps,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_tokens,
        mean_acceptance_length=mean,
    )


@dataclass
class ServerCounters:
    started: float = field(default_factory=time.monotonic)
    num_finished: int = 0
    num_generated_tokens: int = 0
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    num_retractions: int = 0  # running requests sent back to the queue (router/retraction.py)

    def record_finish(
        self,
        completion_tokens: int,
        verify_steps: int = 0,
        draft_tokens: int = 0,
        accepted_tokens: int = 0,
    ) -> None:
        self.num_finished += 1
        self.num_generated_tokens += completion_tokens
        self.verify_steps += verify_steps
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted_tokens

    def speculation(self) -> pb.SpeculationStats:
        return speculation_stats(self.verify_steps, self.draft_tokens, self.accepted_tokens)

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started
