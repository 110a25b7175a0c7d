"""Speculation that switches itself off where it would lose (``--adaptive-speculation``).

Per bucket of decoding-batch sizes the router keeps the tokens per second it measured for
speculative rounds and for target-only steps (the step's wall time through the router: RPCs,
commit and streaming included; a multi-step Forward's K tokens per request count as K), and
runs the mode that wins. Both modes commit the target's own tokens, so switching never changes
a greedy output; only the speed moves.

* A rate is the median of the newest WINDOW clean measurements, those of the mode not in use
  from its latest probe only: one slow step (a first graph replay, a collection) does not
  decide a bucket, and a drafter that got better is seen at the next probe. Clean means
  decode-only and no drafter catch-up in the step: those costs are a transition's, not the
  mode's.
* Hysteresis, asymmetric on purpose: speculation starts only when it measures ON_ABOVE times
  target-only and stops once it is no longer OFF_BELOW times it, so the switch never keeps a
  mode it measured losing, and two close rates do not flip it every step.
* Learning: a new bucket starts in its nearest decided neighbour's mode (none yet: the mode the
  batch runs in now, which costs no transition), takes MIN_SAMPLES of it, then probes the other
  mode at once. Probes recur after ``probe_after`` steps in the bucket, doubling from
  FIRST_PROBE_AFTER to MAX_PROBE_AFTER. A probe wants PROBE_STEPS clean steps of the other
  mode (one, when it is CLEAR) and lasts PROBE_BUDGET steps at most (a probe of speculation
  first catches the drafters up, which takes steps at large batches), so probing costs at most
  PROBE_BUDGET / probe_after of a bucket's steps.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from protos import generation_pb2 as pb

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WINDOW = 8  # newest clean measurements kept per mode
MIN_SAMPLES = 2  # of the bucket's first mode before its first probe
PROBE_STEPS = 3  # clean measurements a probe collects, unless the first one is CLEAR
CLEAR = 2.0  # a probe's first step this many times faster or slower than the mode ends it
PROBE_BUDGET = 16  # steps a probe may last, measured or not
FIRST_PROBE_AFTER = 16  # steps in the bucket between probes, doubling while they confirm
MAX_PROBE_AFTER = 512
ON_ABOVE = 1.10  # speculate once speculation measures this many times target-only's rate
OFF_BELOW = 1.02  # stop once it no longer measures this many times it


@dataclass
class _Bucket:
    speculating: bool
    samples: dict[bool, deque[float]] = field(
        default_factory=lambda: {m: deque(maxlen=WINDOW) for m in (True, False)}
    )
    num_measured: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    probe_left: int = 0  # clean steps the running probe still wants; 0: not probing
    probe_budget: int = 0  # steps the running probe may still take
    since_probe: int = 0
    probe_after: int = FIRST_PROBE_AFTER
    num_probes: int = 0
    num_switches: int = 0
    _stale: deque[float] = field(default_factory=deque)  # the probed mode's samples before it

    @property
    def mode(self) -> bool:
        """The mode of this bucket's next step: the settled one, or the other while probing."""
        return self.speculating != (self.probe_left > 0)

    def rate(self, speculative: bool) -> float | None:
        samples = self.samples[speculative]
        return statistics.median(samples) if samples else None

    @property
    def decided(self) -> bool:
        return all(self.samples.values())

    def record(self, speculative: bool, tok_s: float | None) -> None:
        """One decode-only step of this bucket; ``tok_s`` None: not clean, not measured."""
        if tok_s is not None:
            self.samples[speculative].append(tok_s)
            self.num_measured[speculative] += 1
        if self.probe_left:
            self._probe_step(speculative == self.mode and tok_s is not None)
            return
        self.since_probe += 1
        if self.decided and tok_s is not None:
            self._settle()  # the mode in use drifted (acceptance, load): compare again
        if self._probe_due():
            self._start_probe()

    def _probe_due(self) -> bool:
        if self.num_probes == 0:  # early: as soon as the first mode is measured
            return len(self.samples[self.speculating]) >= MIN_SAMPLES
        return self.since_probe >= self.probe_after

    def _start_probe(self) -> None:
        # The probe's own steps replace what that mode measured long ago.
        other = not self.speculating
        self._stale, self.samples[other] = self.samples[other], deque(maxlen=WINDOW)
        self.probe_left, self.probe_budget = PROBE_STEPS, PROBE_BUDGET
        self.num_probes += 1

    def _probe_step(self, measured: bool) -> None:
        self.probe_left -= measured
        self.probe_budget -= 1
        if self.probe_left and self.probe_budget > 0 and not self._clear():
            return
        other = not self.speculating
        if not self.samples[other]:  # nothing clean came: the old evidence stands
            self.samples[other] = self._stale
        self.probe_left, self.since_probe = 0, 0
        self._settle()
        self.probe_after = min(2 * self.probe_after, MAX_PROBE_AFTER)

    def _clear(self) -> bool:
        """Whether the probe's steps so far already differ from the mode in use by CLEAR:
        more of them would not change the verdict, only cost."""
        probed, held = self.rate(not self.speculating), self.rate(self.speculating)
        return (
            probed is not None and held is not None and not (held / CLEAR < probed < held * CLEAR)
        )

    def _settle(self) -> bool:
        """Re-decides the mode from the rates; returns True when it changed."""
        spec, plain = self.rate(True), self.rate(False)
        if spec is None or plain is None:
            return False
        if self.speculating and spec < plain * OFF_BELOW:
            self.speculating = False
        elif not self.speculating and spec > plain * ON_ABOVE:
            self.speculating = True
        else:
            return False
        self.num_switches += 1
        return True

    def status(self, size: int) -> pb.SpeculationSwitchBucket:
        return pb.SpeculationSwitchBucket(
            batch_size=size,
            speculative_tok_s=self.rate(True) or 0.0,
            target_only_tok_s=self.rate(False) or 0.0,
            speculating=self.speculating,
            speculative_steps=self.num_measured[True],
            target_only_steps=self.num_measured[False],
            probing=self.probe_left > 0,
            num_probes=self.num_probes,
            num_switches=self.num_switches,
        )


class SpeculationSwitch:
    """Asked before each decode step whose batch wants speculation, told after it what it
    measured. Pure bookkeeping on numbers: the scheduler (router/scheduler.py) does the rest."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._buckets: dict[int, _Bucket] = {}
        self._last_mode = True  # the mode the last step ran: a new bucket's default start

    @property
    def num_switches(self) -> int:
        return sum(b.num_switches for b in self._buckets.values())

    def speculate_next(self, num_decoding: int) -> bool:
        """Whether the next step with this many decoding requests should speculate."""
        if not self.enabled or num_decoding == 0:
            return True
        return self._bucket(num_decoding).mode

    def record(
        self, num_decoding: int, speculative: bool, tokens: int, seconds: float, clean: bool = True
    ) -> None:
        """One decode-only step: ``tokens`` committed in ``seconds`` of the step's wall time;
        ``clean`` False (a drafter caught up in it) counts the step but not its rate."""
        if not self.enabled or num_decoding == 0:
            return
        self._last_mode = speculative
        measured = clean and tokens > 0 and seconds > 0
        self._bucket(num_decoding).record(speculative, tokens / seconds if measured else None)

    def _bucket(self, num_decoding: int) -> _Bucket:
        size = bucket_of(num_decoding)
        if size not in self._buckets:
            self._buckets[size] = _Bucket(speculating=self._prior(size))
        return self._buckets[size]

    def _prior(self, size: int) -> bool:
        """A new bucket's first mode: its nearest decided neighbour's (equally near ones
        disagreeing: target-only), else the mode running now."""
        decided = [(abs(BUCKETS.index(s) - BUCKETS.index(size)), s)
                   for s, b in self._buckets.items() if b.decided]  # fmt: skip
        if not decided:
            return self._last_mode
        nearest = min(d for d, _ in decided)
        return all(self._buckets[s].speculating for d, s in decided if d == nearest)

    def status(self) -> pb.SpeculationSwitchStatus:
        return pb.SpeculationSwitchStatus(
            enabled=self.enabled,
            num_switches=self.num_switches,
            buckets=[self._buckets[s].status(s) for s in sorted(self._buckets)],
            num_probes=sum(b.num_probes for b in self._buckets.values()),
        )


def bucket_of(num_decoding: int) -> int:
    return next((b for b in BUCKETS if b >= num_decoding), BUCKETS[-1])
