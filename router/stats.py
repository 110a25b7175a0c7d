"""Server-wide counters reported by GetServerStatus."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from protos import generation_pb2 as pb
from router.request import Request


def speculation_stats(
    verify_steps: int, draft_tokens: int, accepted_tokens: int, forced_tokens: int = 0
) -> pb.SpeculationStats:
    """Acceptance length counts committed tokens per verify step: accepted drafts + the bonus."""
    mean = (accepted_tokens + verify_steps) / verify_steps if verify_steps else 0.0
    return pb.SpeculationStats(
        verify_steps=verify_steps,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_tokens,
        mean_acceptance_length=mean,
        forced_tokens=forced_tokens,
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
        self._add_work(completion_tokens, verify_steps, draft_tokens, accepted_tokens)

    def record_failed(self, req: Request) -> None:
        """A request a server error ended: its work stays in the totals; it did not finish."""
        self._add_work(len(req.output_ids), req.verify_steps, req.draft_tokens, req.accepted_tokens)

    def _add_work(
        self, completion_tokens: int, verify_steps: int, draft_tokens: int, accepted_tokens: int
    ) -> None:
        self.num_generated_tokens += completion_tokens
        self.verify_steps += verify_steps
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted_tokens

    def speculation(self, in_flight: Iterable[Request] = ()) -> pb.SpeculationStats:
        """Totals over the finished requests and ``in_flight`` (running or queued: their
        counts so far; a request adds its own to the totals when it finishes)."""
        steps, drafts, accepted = self.verify_steps, self.draft_tokens, self.accepted_tokens
        for req in in_flight:
            steps += req.verify_steps
            drafts += req.draft_tokens
            accepted += req.accepted_tokens
        return speculation_stats(steps, drafts, accepted)

    def generated_tokens(self, in_flight: Iterable[Request] = ()) -> int:
        """Tokens generated so far: the finished requests' and ``in_flight``'s."""
        return self.num_generated_tokens + sum(len(req.output_ids) for req in in_flight)

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started
