"""Where a decode step's time goes, as the router sees it (GetServerStatus.target_only_steps and
.speculative_steps): the wall time of the whole step, of its awaits on the target's Forward or
Verify and on the drafters' Propose, and the services' own measure of their work (forward_ms in
the target's replies, compute_ms in the drafters', and of that the device's time on the kernels,
device_ms in both). What is left of the step is the router's
(scheduling, commit, detokenize, streaming); what a call took beyond the service's work is the
RPC's (serialization, the hops). A speculative step's Propose usually left in the step before,
as soon as its Verify replied (router/draft_ahead.py): its await is then the wait that was left,
and the drafter's work overlaps the router's commit of the step before. Decode-only steps are
counted: a prefill chunk's cost says nothing of a round. Nor does catching a drafter up (an
Ingest of a request's whole context after its prefill or a target-only spell): a step's clock
starts after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from protos import generation_pb2 as pb
from protos import target_pb2

TargetReply = target_pb2.ForwardResponse | target_pb2.VerifyResponse


@dataclass
class StepClock:
    """One step's spans, in seconds, and the target's reported work in ms."""

    started: float = field(default_factory=time.perf_counter)
    spans: dict[str, float] = field(default_factory=dict)
    target_compute_ms: float = 0.0
    draft_compute_ms: float = 0.0
    target_device_ms: float = 0.0
    draft_device_ms: float = 0.0

    def target_replied(self, *replies: TargetReply | None) -> None:
        """The target's own measure of the step's calls (None: a call the step did not make)."""
        made = [r for r in replies if r is not None]
        self.target_compute_ms = sum(r.forward_ms for r in made)
        self.target_device_ms = sum(r.device_ms for r in made)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.spans[name] = self.spans.get(name, 0.0) + time.perf_counter() - began


@dataclass
class _Totals:
    steps: int = 0
    step_s: float = 0.0
    target_s: float = 0.0
    target_compute_ms: float = 0.0
    draft_s: float = 0.0
    draft_compute_ms: float = 0.0
    target_device_ms: float = 0.0
    draft_device_ms: float = 0.0

    def add(self, clock: StepClock) -> None:
        self.steps += 1
        self.step_s += time.perf_counter() - clock.started
        self.target_s += clock.spans.get("target", 0.0)
        self.draft_s += clock.spans.get("draft", 0.0)
        self.target_compute_ms += clock.target_compute_ms
        self.draft_compute_ms += clock.draft_compute_ms
        self.target_device_ms += clock.target_device_ms
        self.draft_device_ms += clock.draft_device_ms

    def status(self) -> pb.StepTiming:
        n = max(self.steps, 1)
        return pb.StepTiming(
            steps=self.steps,
            step_ms=self.step_s / n * 1e3,
            target_call_ms=self.target_s / n * 1e3,
            target_compute_ms=self.target_compute_ms / n,
            draft_call_ms=self.draft_s / n * 1e3,
            draft_compute_ms=self.draft_compute_ms / n,
            target_device_ms=self.target_device_ms / n,
            draft_device_ms=self.draft_device_ms / n,
        )


class StepTimings:
    def __init__(self) -> None:
        self._by_mode = {False: _Totals(), True: _Totals()}

    def record(self, speculative: bool, clock: StepClock) -> None:
        self._by_mode[speculative].add(clock)

    def status(self, speculative: bool) -> pb.StepTiming:
        return self._by_mode[speculative].status()
