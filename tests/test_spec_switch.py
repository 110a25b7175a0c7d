"""router/spec_switch.py: which mode the switch picks from measured rates, with hysteresis and
probes (pure logic, measured rates given by hand; the real stack: test_e2e_spec_switch.py)."""

from __future__ import annotations

from router.spec_switch import MARGIN, PROBE_EVERY, SpeculationSwitch


def run_steps(switch: SpeculationSwitch, steps: int, spec_tok_s: float, plain_tok_s: float,
              batch: int = 1) -> list[bool]:
    """Steps as the scheduler runs them: ask, then record that mode's measured rate."""
    modes = []
    for _ in range(steps):
        speculative = switch.speculate_next(batch)
        rate = spec_tok_s if speculative else plain_tok_s
        switch.record(batch, speculative, tokens=int(rate), seconds=1.0)
        modes.append(speculative)
    return modes


def test_disabled_always_speculates() -> None:
    switch = SpeculationSwitch(enabled=False)
    assert run_steps(switch, 50, spec_tok_s=1, plain_tok_s=100) == [True] * 50
    assert not switch.status().buckets


def test_a_losing_mode_is_left_and_probed() -> None:
    switch = SpeculationSwitch(enabled=True)
    modes = run_steps(switch, 200, spec_tok_s=40, plain_tok_s=100)
    assert modes[:2] == [True, True] and modes[2] is False  # measures both, then switches
    tail = modes[10:]
    assert 0 < sum(tail) <= len(tail) / PROBE_EVERY + 1  # only probes speculate
    bucket = switch.status().buckets[0]
    assert (bucket.batch_size, bucket.speculating) == (1, False)
    assert bucket.speculative_tok_s == 40 and bucket.target_only_tok_s == 100


def test_a_drafter_that_gets_better_is_switched_back_on() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 100, spec_tok_s=40, plain_tok_s=100)
    modes = run_steps(switch, 4 * PROBE_EVERY, spec_tok_s=300, plain_tok_s=100)
    assert all(modes[-PROBE_EVERY + 1 :])  # speculating again after the next probe
    assert switch.num_switches >= 2


def test_rates_within_the_margin_do_not_flip_the_mode() -> None:
    switch = SpeculationSwitch(enabled=True)
    close = 100 * (1 - MARGIN / 2)
    modes = run_steps(switch, 100, spec_tok_s=close, plain_tok_s=100)
    assert switch.num_switches == 0 and sum(modes) >= 90


def test_batch_sizes_are_measured_apart() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 50, spec_tok_s=300, plain_tok_s=100, batch=1)
    run_steps(switch, 50, spec_tok_s=100, plain_tok_s=300, batch=20)
    by_size = {b.batch_size: b.speculating for b in switch.status().buckets}
    assert by_size == {1: True, 32: False}
