"""A step's mode, speculative or target-only, and what the step reports once it ran: its rate to
the speculation switch (router/spec_switch.py) and its timings to GetServerStatus."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from router.config import RouterConfig
from router.request import Request
from router.spec_switch import SpeculationSwitch
from router.speculation import Speculation
from router.step_timing import StepClock, StepTimings

if TYPE_CHECKING:
    from router.scheduler import Planned

log = logging.getLogger("splitspec.router")


class StepMode:
    def __init__(self, config: RouterConfig, spec: Speculation) -> None:
        self.switch = SpeculationSwitch(config.adaptive_speculation)
        self.timings = StepTimings()
        self.max_speculative_batch = config.max_speculative_batch
        self.spec = spec
        self.batch = 0  # the batch size the switch chose this step's mode for (0: none)

    def choose(self, running: list[Request], ends_a_prefill: bool = False) -> bool:
        """Whether this step speculates: not under load, where a wider batch beats longer
        trees (--max-speculative-batch), nor where the switch measured speculation losing.

        Under the switch, not in a step that ends a prompt's prefill either: that request's
        first token then waits out one decode step of the others, not a speculative round (a
        CPU `splitspec serve` under 0.5 requests a second: 117-120 ms to the first token at p50
        against 174-180 without the hold, target-only 74-81; 2026-12-05). Without the switch
        speculation runs wherever a request allows it: where prompts end in every step,
        holding them all would leave the decoding requests never speculating."""
        decoding = [r for r in running if not r.is_prefilling]
        wanted = any(self.spec.wanted(r) for r in decoding)
        asked = wanted and len(decoding) <= self.max_speculative_batch
        if asked and ends_a_prefill:
            asked = not self.switch.hold_for_prefill()
        self.batch = len(decoding) if asked else 0
        return asked and self.switch.speculate_next(len(decoding))

    def measure(
        self,
        plan: list[Planned],
        running: list[Request],
        speculative: bool,
        clock: StepClock,
        emitted: int,
        clean: bool,
        started: float,
    ) -> None:
        """A decode-only step's committed tokens over its whole wall time since ``started``
        (catch-up, RPCs, commit, streaming, releases): the speculation switch's input; and
        GetServerStatus's step timings from ``clock``. The switch counts every step it chose
        the mode of (a probe's budget runs in steps with a prompt too) but takes the rate of
        a clean one only: decode-only, ``clean`` (no drafter caught up in it, no Propose sent
        ahead awaited by a target-only step), no request finished in it (its release RPCs, and
        its last Forward cut to the tokens it had left, are the request's end, not the mode's)
        and no prompt waiting (which holds a target-only step to one decode step)."""
        decode_only = bool(plan) and not any(p.prefill for p in plan)
        if self.batch:
            tokens = sum(len(p.req.output_ids) for p in plan) - emitted
            seconds = time.perf_counter() - started
            ended = any(p.req.finished for p in plan)
            waiting = any(r.is_prefilling for r in running)
            clean = clean and decode_only and not ended and not waiting
            self.switch.record(self.batch, speculative, tokens, seconds, clean)
            if log.isEnabledFor(logging.DEBUG):  # --log-level debug; else nothing per step
                log.debug("step: batch %d, %s, %d tokens in %.2f ms, %s", self.batch,
                          "speculative" if speculative else "target-only", tokens,
                          seconds * 1e3, "measured" if clean else "not measured")  # fmt: skip
        if decode_only:
            self.timings.record(speculative, clock)
