"""Speculation that switches itself off where it would lose (``--adaptive-speculation``).

Per batch-size bucket the router keeps a moving average of the tokens per second it measured
for speculative rounds (propose + verify) and for target-only steps, and speculates while the
first wins. Switching needs a margin either way (hysteresis), so two close rates do not flip
the mode every step. The mode not in use is probed now and then (one step in PROBE_EVERY), so
a drafter that got better (or a batch that got lighter) is noticed. Both modes give the
target's own tokens, so switching never changes a greedy output; only the speed moves.

Only steps without prefill chunks are measured: a prefill's cost says nothing of either mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protos import generation_pb2 as pb

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROBE_EVERY = 32  # steps in the losing mode between probes of the other one
MARGIN = 0.1  # switch only when the other mode is this much faster
SMOOTHING = 0.25  # weight of the newest step in the moving averages


@dataclass
class _Bucket:
    rates: dict[bool, float] = field(default_factory=dict)  # speculative? -> tok/s
    speculating: bool = True
    steps_in_mode: int = 0

    def record(self, speculative: bool, tok_s: float) -> None:
        old = self.rates.get(speculative)
        self.rates[speculative] = tok_s if old is None else old + SMOOTHING * (tok_s - old)

    def settle(self) -> bool:
        """Re-decides the mode from the rates; returns True when it changed."""
        spec, plain = self.rates.get(True), self.rates.get(False)
        if spec is None or plain is None:
            return False
        if self.speculating and spec < plain * (1 - MARGIN):
            self.speculating = False
        elif not self.speculating and spec > plain * (1 + MARGIN):
            self.speculating = True
        else:
            return False
        self.steps_in_mode = 0
        return True


class SpeculationSwitch:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.num_switches = 0
        self._buckets = {b: _Bucket() for b in BUCKETS}

    def speculate_next(self, num_decoding: int) -> bool:
        """Whether the next step with this many decoding requests should speculate."""
        if not self.enabled or num_decoding == 0:
            return True
        bucket = self._buckets[_bucket_of(num_decoding)]
        if False not in bucket.rates and bucket.steps_in_mode >= 2:
            return False  # the first target-only measurement, after two speculative ones
        if bucket.steps_in_mode and bucket.steps_in_mode % PROBE_EVERY == 0:
            return not bucket.speculating
        return bucket.speculating

    def record(self, num_decoding: int, speculative: bool, tokens: int, seconds: float) -> None:
        """One measured step: ``tokens`` committed in ``seconds`` of wall time."""
        if not self.enabled or num_decoding == 0 or tokens <= 0 or seconds <= 0:
            return
        bucket = self._buckets[_bucket_of(num_decoding)]
        bucket.record(speculative, tokens / seconds)
        bucket.steps_in_mode += 1
        self.num_switches += bucket.settle()

    def status(self) -> pb.SpeculationSwitchStatus:
        return pb.SpeculationSwitchStatus(
            enabled=self.enabled,
            num_switches=self.num_switches,
            buckets=[
                pb.SpeculationSwitchBucket(
                    batch_size=size,
                    speculative_tok_s=b.rates.get(True, 0.0),
                    target_only_tok_s=b.rates.get(False, 0.0),
                    speculating=b.speculating,
                )
                for size, b in self._buckets.items()
                if b.rates
            ],
        )


def _bucket_of(num_decoding: int) -> int:
    return next((b for b in BUCKETS if b >= num_decoding), BUCKETS[-1])
