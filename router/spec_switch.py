"""Speculation that switches itself off where it would lose (``--adaptive-speculation``).

Per bucket of decoding-batch sizes the router keeps the tokens per second it measured for
speculative rounds and for target-only steps (the step's wall time through the router: RPCs,
commit and streaming included; a multi-step Forward's K tokens per request count as K), and
runs the mode that wins. Both modes commit the target's own tokens, so switching never changes
a greedy output; only the speed moves. The names in capitals below are router/spec_bucket.py's
constants, and a bucket's own rules live there beside them.

* A rate is the mean tokens of the mode's window over the median seconds of its newest
  WINDOW clean steps: one slow step (a first graph replay, a collection) does not decide a
  bucket. Target-only's window is those WINDOW steps, from its latest probe only.
  Speculation's is its newest SPEC_ROUNDS rounds, kept across probes (rounds accept in long
  runs, see SPEC_ROUNDS), unless a probe measures CLEAR away from SPEC_MIN_ROUNDS or more of
  them: then a drafter that got better (or worse) is seen at that probe, from its rounds
  alone. Not the median of per-step rates: a round commits 1 to 9 tokens in about the same
  time, skewed, so that median underrates speculation (by ~6% on the H200's rounds). Clean means
  decode-only, no drafter catch-up, no wait for a Propose the last speculative step sent
  ahead (in a target-only step), no request finishing and no prompt waiting in the step:
  those are a transition's or a request's costs (an Ingest, that Propose, release RPCs, a
  last Forward cut to the tokens left), not the mode's. Every step counts as a step of its
  bucket and of a probe, clean or not. Closed groups end together, so most of their steps
  are clean; under staggered load about exp(-B*T/L) are (B requests of L tokens, T tokens
  per step each: 37% at B=32, T=8, L=256), and a bucket above a clear loser needs no
  samples (below).
* Hysteresis, asymmetric on purpose: speculation starts only when it measures ON_ABOVE times
  target-only and stops once it is no longer OFF_BELOW times it, so the switch never keeps a
  mode it measured losing, and two close rates do not flip it every step.
* Monotonicity: speculation's advantage only shrinks as the batch grows (a verify costs more
  per request, a target-only step less). A bucket's verdict (speculation's rate over
  target-only's when it last settled) at or below 1/IMPLIES holds every larger bucket
  target-only, one at or above IMPLIES every smaller bucket speculating: a held bucket runs
  that mode, never probes and forms no verdict, so probes happen only at the boundary
  between the smallest clear loser and the largest clear winner, where a change of
  acceptance shows first; when the boundary moves, the buckets it frees measure for
  themselves again. Only free buckets settle, so winners always lie below losers. A verdict
  forms at a probe's first clean step as well as at its end, so a bucket only passed through
  mid-probe (a warm-up's batch size) still holds the larger ones.
* Learning: a new free bucket starts in its nearest neighbour's mode among those with a
  verdict (none yet: the mode the batch runs in now, which costs no transition), takes
  MIN_SAMPLES clean steps of it (SPEC_MIN_ROUNDS rounds of speculation: a reply's first rounds
  may all be a slow run), then probes the other mode at once. Probes recur after ``probe_after``
  steps in the bucket, from FIRST_PROBE_AFTER up to MAX_PROBE_AFTER: x4 after a probe whose
  mode lost by CLEAR (a 0.4x speculation needs a large change to win), else x2. A probe
  starts after a clean step (not in a burst of unclean ones: a batch passing through this
  size while prompts prefill or requests end), wants PROBE_STEPS clean steps of target-only
  or SPEC_PROBE_STEPS of speculation (CLEAR_STEPS or SPEC_CLEAR_STEPS, when they are CLEAR:
  a round's tokens vary, a target-only step's do not) and lasts PROBE_BUDGET steps at most
  (a probe of speculation first catches the drafters up, which takes steps at large
  batches), so probing costs at most PROBE_BUDGET / probe_after of a bucket's steps.
"""

from __future__ import annotations

from protos import generation_pb2 as pb
from router.spec_bucket import BUCKETS, IMPLIES, Bucket


class SpeculationSwitch:
    """Asked before each decode step whose batch wants speculation, told after it what it
    measured. Pure bookkeeping on numbers: the scheduler (router/scheduler.py) does the rest."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._buckets: dict[int, Bucket] = {}
        self._last_mode = True  # the mode the last step ran: a new bucket's default start
        self.num_prefill_holds = 0  # steps that ended a prefill, held target-only

    def hold_for_prefill(self) -> bool:
        """Whether a step that ends a prompt's prefill runs target-only: wherever the switch
        is on (router/step_mode.py says why). Counts the steps it holds."""
        if self.enabled:
            self.num_prefill_holds += 1
        return self.enabled

    @property
    def num_switches(self) -> int:
        return sum(b.num_switches for b in self._buckets.values())

    def speculate_next(self, num_decoding: int) -> bool:
        """Whether the next step with this many decoding requests should speculate."""
        if not self.enabled or num_decoding == 0:
            return True
        bucket, _ = self._bucket(num_decoding)
        return bucket.mode

    def record(
        self, num_decoding: int, speculative: bool, tokens: int, seconds: float, clean: bool = True
    ) -> None:
        """One step whose mode ``speculate_next`` chose: ``tokens`` committed in ``seconds`` of
        its wall time; ``clean`` False (see the module's docstring) counts the step but not
        its rate."""
        if not self.enabled or num_decoding == 0:
            return
        self._last_mode = speculative
        measured = clean and tokens > 0 and seconds > 0
        bucket, held = self._bucket(num_decoding)
        bucket.record(speculative, (tokens, seconds) if measured else None, held)

    def _bucket(self, num_decoding: int) -> tuple[Bucket, bool]:
        """The bucket (made in its prior mode when new) and whether other buckets' verdicts
        decide its mode, which it then holds."""
        size = bucket_of(num_decoding)
        implied = self.implied(size)
        if size not in self._buckets:
            start = self._prior(size) if implied is None else implied
            self._buckets[size] = Bucket(speculating=start)
        bucket = self._buckets[size]
        if implied is not None:
            bucket.hold(implied)
        return bucket, implied is not None

    def implied(self, size: int) -> bool | None:
        """The mode other buckets' clear verdicts hold this one in, by monotonicity (see the
        module's docstring); None: it is free and measures for itself."""
        verdicts = {s: b.verdict for s, b in self._buckets.items() if b.verdict is not None}
        if any(size > s and v * IMPLIES <= 1 for s, v in verdicts.items()):
            return False
        if any(size < s and v >= IMPLIES for s, v in verdicts.items()):
            return True
        return None

    def _prior(self, size: int) -> bool:
        """A new bucket's first mode: its nearest neighbour's among those with a verdict
        (equally near ones disagreeing: target-only), else the mode running now."""
        decided = [(abs(BUCKETS.index(s) - BUCKETS.index(size)), s)
                   for s, b in self._buckets.items() if b.verdict is not None]  # fmt: skip
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
            num_prefill_holds=self.num_prefill_holds,
        )


def bucket_of(num_decoding: int) -> int:
    return next((b for b in BUCKETS if b >= num_decoding), BUCKETS[-1])
