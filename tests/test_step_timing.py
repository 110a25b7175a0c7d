"""router/step_timing.py: spans and means (pure logic; the real stack: test_e2e_spec_switch.py)."""

from __future__ import annotations

import time

from router.step_timing import StepClock, StepTimings


def test_spans_add_up_per_mode() -> None:
    timings = StepTimings()
    for _ in range(2):
        clock = StepClock()
        with clock.span("target"):
            time.sleep(0.01)
        with clock.span("draft"):
            time.sleep(0.005)
        clock.target_compute_ms, clock.draft_compute_ms = 4.0, 3.0
        timings.record(True, clock)
    spec, plain = timings.status(True), timings.status(False)
    assert (spec.steps, plain.steps) == (2, 0)
    assert spec.step_ms >= spec.target_call_ms + spec.draft_call_ms
    assert spec.target_call_ms >= 10 and spec.draft_call_ms >= 5
    assert spec.target_compute_ms == 4.0 and spec.draft_compute_ms == 3.0
    assert plain.step_ms == 0.0  # no steps: zeros, not a division by zero
