"""One bucket of batch sizes in the adaptive speculation switch: its two modes' measured rates,
its probes and its verdict (the rules: router/spec_switch.py's docstring)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from protos import generation_pb2 as pb

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WINDOW = 8  # newest clean steps whose median seconds a rate divides by; all of target-only's
# Speculation's tokens a round: its rounds commit 1 to 9 tokens in runs (prose, code, a list)
# of tens of rounds, so a rate over a few rounds swings by 2x and more around the reply's mean.
# Over 8 rounds the switch turned speculation off in every slow run and then held it off for
# hundreds of steps: a CPU `splitspec serve` got 1.25x target-only where always speculating got
# 1.58x (held-out ShareGPT, 2026-12-05). The mean of the newest SPEC_ROUNDS rounds, kept across
# probes, is the rate's numerator instead.
SPEC_ROUNDS = 256
MIN_SAMPLES = 2  # of the bucket's first mode before its first probe
# Nor is speculation judged on fewer rounds than this: a bucket that starts speculating first
# probes target-only after SPEC_MIN_ROUNDS clean rounds, and a probe of speculation adds its
# rounds to fewer kept ones instead of starting afresh. Judged on its first 2 rounds, a reply
# that opened with a slow run (1-2 tokens a round) turned speculation off for most of 400 steps
# (0.97x target-only where always speculating ran 1.82x; a cold CPU `splitspec serve`, 1
# token a round on its first probe, did so).
SPEC_MIN_ROUNDS = 16
PROBE_STEPS = 3  # clean measurements a probe of target-only collects, unless CLEAR
CLEAR = 2.0  # a probe's first steps this many times faster or slower than the mode end it
CLEAR_STEPS = 2  # the fewest clean steps of a probe of target-only that CLEAR ends
# A probe of speculation wants more: a round commits 1 to 9 tokens, so a few rounds' rate is a
# poor guess. On the H200 (2026-12-03, router --log-level debug) one probe's rounds committed 1,
# 2, 1, 1 tokens (0.2-0.4x) where speculation ran at 0.8x, and ended the probe with one or two
# steps. Not the catch-up's doing (benchmarks/gpu_catch_up.py: after a re-ingest the drafter
# accepts what it would have without one, round for round): runs of rounds accepting nothing
# are common in any stretch of a reply.
SPEC_PROBE_STEPS = 6
SPEC_CLEAR_STEPS = 4
PROBE_BUDGET = 16  # steps a probe may last, measured or not
FIRST_PROBE_AFTER = 16  # steps in the bucket between probes, growing while they confirm
MAX_PROBE_AFTER = 512
ON_ABOVE = 1.10  # speculate once speculation measures this many times target-only's rate
OFF_BELOW = 1.02  # stop once it no longer measures this many times it
IMPLIES = 1.25  # a verdict this far from 1 decides the buckets beyond it (larger or smaller)

Sample = tuple[int, float]  # a clean step's committed tokens and wall seconds


@dataclass
class Bucket:
    speculating: bool
    samples: dict[bool, deque[Sample]] = field(
        default_factory=lambda: {m: _window(m) for m in (True, False)}
    )
    num_measured: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    probe_left: int = 0  # clean steps the running probe still wants; 0: not probing
    probe_budget: int = 0  # steps the running probe may still take
    since_probe: int = 0
    probe_after: int = FIRST_PROBE_AFTER
    num_probes: int = 0
    num_switches: int = 0
    verdict: float | None = None  # speculation's rate over target-only's when last settled
    _stale: deque[Sample] = field(default_factory=deque)  # the probed mode's samples before it

    @property
    def mode(self) -> bool:
        """The mode of this bucket's next step: the settled one, or the other while probing."""
        return self.speculating != (self.probe_left > 0)

    def rate(self, speculative: bool) -> float | None:
        """Mean tokens of the mode's window over the median seconds of its newest steps."""
        samples = self.samples[speculative]
        return _rate_of(samples) if samples else None

    @property
    def decided(self) -> bool:
        return all(self.samples.values())

    def record(self, speculative: bool, sample: Sample | None, held: bool = False) -> None:
        """One step of this bucket; ``sample`` (tokens, seconds), None: not clean, not
        measured; ``held``: other buckets' verdicts decide this one's mode (see ``hold``)."""
        if sample is not None:
            self.samples[speculative].append(sample)
            self.num_measured[speculative] += 1
        if self.probe_left:
            self._probe_step(speculative == self.mode and sample is not None)
            return
        self.since_probe += 1
        if held or sample is None:
            # Unclean: a probe starts after a clean step, not amid a burst of unclean ones (a
            # batch passing this size while prompts prefill or requests end), where its budget
            # would run out with nothing measured.
            return
        if self.decided:
            self._settle()  # the mode in use drifted (acceptance, load): compare again
        if self._probe_due():
            self._start_probe()

    def hold(self, speculating: bool) -> None:
        """Runs ``speculating``, decided by other buckets' verdicts: no probe, no settling.
        A probe under way stops; what it measured stays."""
        if self.probe_left:
            self._stop_probe()
        if self.speculating != speculating:
            self.speculating = speculating
            self.num_switches += 1

    def _probe_due(self) -> bool:
        if self.num_probes == 0:  # early: as soon as the first mode is measured
            wanted = SPEC_MIN_ROUNDS if self.speculating else MIN_SAMPLES
            return len(self.samples[self.speculating]) >= wanted
        return self.since_probe >= self.probe_after

    def _start_probe(self) -> None:
        # The probe's own steps are judged alone first (_stop_probe may join them to the old).
        other = not self.speculating
        self._stale, self.samples[other] = self.samples[other], _window(other)
        self.probe_left = SPEC_PROBE_STEPS if other else PROBE_STEPS
        self.probe_budget = PROBE_BUDGET
        self.num_probes += 1

    def _probe_step(self, measured: bool) -> None:
        self.probe_left -= measured
        self.probe_budget -= 1
        spec, plain = self.rate(True), self.rate(False)
        if measured and spec is not None and plain is not None:
            # Both rates are known from the probe's first clean step: other buckets may lean on
            # them at once. A bucket left mid-probe (a batch size only passed through, such as a
            # warm-up's) would otherwise never form the verdict that holds larger ones.
            self.verdict = spec / plain
        if not self.probe_left or self.probe_budget <= 0 or self._clear():
            self._end_probe()

    def _end_probe(self) -> None:
        self._stop_probe()
        switched = self._settle()
        self.probe_after = min(self._backoff(switched) * self.probe_after, MAX_PROBE_AFTER)

    def _stop_probe(self) -> None:
        other = not self.speculating
        probed = self.samples[other]
        if not probed:  # nothing clean came: the old evidence stands
            self.samples[other] = self._stale
        elif other and self._stale and not self._moved(probed):
            # Speculation's rounds in a few more: the old ones still count.
            self.samples[other] = _window(other, [*self._stale, *probed])
        self.probe_left, self.since_probe = 0, 0

    def _moved(self, probed: deque[Sample]) -> bool:
        """Whether a probe's rounds are CLEAR away from SPEC_MIN_ROUNDS or more kept ones (a
        new drafter, another load): they start the window afresh. Fewer kept rounds are no
        yardstick: both are a few rounds of one reply."""
        if len(self._stale) < SPEC_MIN_ROUNDS:
            return False
        old, new = _rate_of(self._stale), _rate_of(probed)
        return not old / CLEAR < new < old * CLEAR

    def _backoff(self, switched: bool) -> int:
        """x4 when the probed mode lost by CLEAR: it needs a large change of acceptance or
        load to win, which a later look sees as well. Else x2 (a probe that switched the
        mode included: the mode left is looked at again at the usual pace)."""
        held, probed = self.rate(self.speculating), self.rate(not self.speculating)
        clear = held is not None and probed is not None and held >= probed * CLEAR
        return 4 if clear and not switched else 2

    def _clear(self) -> bool:
        """Whether the probe's first steps (CLEAR_STEPS or SPEC_CLEAR_STEPS of them) already
        differ from the mode in use by CLEAR: more would not change the verdict, only cost."""
        probing_speculation = not self.speculating
        wanted = SPEC_CLEAR_STEPS if probing_speculation else CLEAR_STEPS
        if len(self.samples[probing_speculation]) < wanted:
            return False
        probed, held = self.rate(not self.speculating), self.rate(self.speculating)
        return (
            probed is not None and held is not None and not (held / CLEAR < probed < held * CLEAR)
        )

    def _settle(self) -> bool:
        """Re-decides the mode from the rates; returns True when it changed."""
        spec, plain = self.rate(True), self.rate(False)
        if spec is None or plain is None:
            return False
        self.verdict = spec / plain
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
            speculative_tok_s=self._reported_rate(True),
            target_only_tok_s=self._reported_rate(False),
            speculating=self.speculating,
            speculative_steps=self.num_measured[True],
            target_only_steps=self.num_measured[False],
            probing=self.probe_left > 0,
            num_probes=self.num_probes,
            num_switches=self.num_switches,
        )

    def _reported_rate(self, speculative: bool) -> float:
        """The mode's rate; for a mode under probe with nothing clean yet, the one it had."""
        if self.probe_left and speculative != self.speculating and not self.samples[speculative]:
            return _rate_of(self._stale) if self._stale else 0.0
        return self.rate(speculative) or 0.0


def _window(speculative: bool, samples: list[Sample] | None = None) -> deque[Sample]:
    return deque(samples or (), maxlen=SPEC_ROUNDS if speculative else WINDOW)


def _rate_of(samples: deque[Sample]) -> float:
    """Mean tokens of all ``samples`` over the median seconds of the newest WINDOW."""
    tokens = statistics.fmean(t for t, _ in samples)
    return tokens / statistics.median(seconds for _, seconds in list(samples)[-WINDOW:])
