"""What the scheduler tells the speculation switch about a step (router/step_mode.py's
``StepMode.measure``): every step the switch chose the mode of counts, but only a clean one gives a
rate; a step that finishes a request, has a prompt in it or waiting, or caught a drafter up
does not (router/spec_switch.py's docstring says why)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from router.config import RouterConfig
from router.request import Request, SamplingOptions
from router.scheduler import Planned
from router.step_mode import StepMode
from router.step_timing import StepClock


def decoding(request_id: str, num_output: int = 3) -> Request:
    req = Request(request_id, [5, 6, 7], SamplingOptions(max_new_tokens=64))
    req.output_ids = list(range(num_output))
    req.num_computed = req.prefill_len
    return req


def measure(plan: list[Planned], running: list[Request], clean: bool = True):
    """One step's report as the scheduler makes it; returns the switch's batch-2 bucket."""
    config = RouterConfig(target_address="unused", model_path=Path("unused"),
                          adaptive_speculation=True)  # fmt: skip
    mode = StepMode(config, spec=None)  # type: ignore[arg-type]  # measure() never drafts
    mode.batch = 2  # the switch chose this step's mode for a batch of 2
    started = time.perf_counter() - 0.01
    mode.measure(plan, running, False, StepClock(), 2, clean, started)
    return mode.switch.status().buckets[0]


def test_a_plain_decode_step_gives_a_rate() -> None:
    a, b = decoding("a"), decoding("b")
    status = measure([Planned(a, 1, True), Planned(b, 1, True)], [a, b])
    assert status.target_only_steps == 1 and status.target_only_tok_s > 0


@pytest.mark.parametrize("why", ["finished", "prompt in it", "prompt waiting", "catch-up"])
def test_unclean_steps_give_no_rate(why: str) -> None:
    a, b = decoding("a"), decoding("b")
    plan, running = [Planned(a, 1, True), Planned(b, 1, True)], [a, b]
    if why == "finished":
        b.finished = True
    waiting = Request("w", list(range(40)), SamplingOptions(max_new_tokens=8))
    if why == "prompt in it":
        plan.append(Planned(waiting, 40, True, prefill=True))
    if why in ("prompt in it", "prompt waiting"):
        running.append(waiting)
    status = measure(plan, running, clean=why != "catch-up")
    # The bucket exists (the step counted), its rate does not.
    assert status.target_only_steps == 0 and status.target_only_tok_s == 0
