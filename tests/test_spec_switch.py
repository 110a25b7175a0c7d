"""router/spec_switch.py: which mode the switch picks from measured rates, with hysteresis,
early and backed-off probes, neighbours' evidence and robust rates (pure logic, rates given by
hand; the real stack: test_e2e_spec_switch.py)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from router.spec_bucket import (
    CLEAR_STEPS,
    FIRST_PROBE_AFTER,
    MAX_PROBE_AFTER,
    MIN_SAMPLES,
    OFF_BELOW,
    ON_ABOVE,
    PROBE_BUDGET,
    PROBE_STEPS,
    SPEC_CLEAR_STEPS,
    SPEC_MIN_ROUNDS,
    SPEC_PROBE_STEPS,
)
from router.spec_switch import SpeculationSwitch

Rate = Callable[[bool], float]


def run_steps(
    switch: SpeculationSwitch,
    steps: int,
    spec_tok_s: float,
    plain_tok_s: float,
    batch: int = 1,
    clean: bool = True,
) -> list[bool]:
    """Steps as the scheduler runs them: ask, then record that mode's measured rate."""
    modes = []
    for _ in range(steps):
        speculative = switch.speculate_next(batch)
        rate = spec_tok_s if speculative else plain_tok_s
        switch.record(batch, speculative, tokens=int(rate), seconds=1.0, clean=clean)
        modes.append(speculative)
    return modes


def bucket(switch: SpeculationSwitch, size: int):  # -> pb.SpeculationSwitchBucket
    return next(b for b in switch.status().buckets if b.batch_size == size)


def test_disabled_always_speculates() -> None:
    switch = SpeculationSwitch(enabled=False)
    assert run_steps(switch, 50, spec_tok_s=1, plain_tok_s=100) == [True] * 50
    assert not switch.status().buckets


def test_a_step_that_ends_a_prefill_is_held_only_under_the_switch() -> None:
    """Without the switch speculation runs wherever a request allows it, prompts or not."""
    off, on = SpeculationSwitch(enabled=False), SpeculationSwitch(enabled=True)
    assert not off.hold_for_prefill() and off.status().num_prefill_holds == 0
    assert on.hold_for_prefill() and on.hold_for_prefill()
    assert on.status().num_prefill_holds == 2


def test_a_losing_mode_is_left_after_a_few_steps_and_probed_ever_less() -> None:
    switch = SpeculationSwitch(enabled=True)
    modes = run_steps(switch, 3000, spec_tok_s=40, plain_tok_s=100)
    # Measures speculation, probes target-only at once (2.5x: CLEAR in CLEAR_STEPS), stays.
    first = SPEC_MIN_ROUNDS + CLEAR_STEPS
    assert modes[:first] == [True] * SPEC_MIN_ROUNDS + [False] * CLEAR_STEPS
    assert not any(modes[first : first + FIRST_PROBE_AFTER])
    # Probes of speculation come back, SPEC_CLEAR_STEPS steps each (CLEAR), ever further apart.
    probe_starts = [i for i in range(1, len(modes)) if modes[i] and not modes[i - 1]]
    gaps = [b - a for a, b in zip(probe_starts, probe_starts[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] >= MAX_PROBE_AFTER, gaps
    assert sum(modes[first:]) == SPEC_CLEAR_STEPS * len(probe_starts)
    assert sum(modes[-1000:]) <= 2 * SPEC_CLEAR_STEPS  # probing costs about 1% by now
    b = bucket(switch, 1)
    assert (b.speculating, b.speculative_tok_s, b.target_only_tok_s) == (False, 40, 100)
    assert switch.num_switches == 1 and b.num_probes == len(probe_starts) + 1


def test_a_winning_drafter_keeps_speculating() -> None:
    switch = SpeculationSwitch(enabled=True)
    modes = run_steps(switch, 500, spec_tok_s=300, plain_tok_s=100)
    assert switch.num_switches == 0 and sum(modes) >= 500 - 5 * PROBE_STEPS


def test_a_close_call_is_probed_for_longer() -> None:
    """Rates within CLEAR of each other: a probe takes PROBE_STEPS clean steps to decide."""
    switch = SpeculationSwitch(enabled=True)
    modes = run_steps(switch, 40, spec_tok_s=70, plain_tok_s=100)
    assert modes[: SPEC_MIN_ROUNDS + PROBE_STEPS + 1] == [True] * SPEC_MIN_ROUNDS + [False] * (
        PROBE_STEPS + 1
    )
    assert not bucket(switch, 1).speculating


def test_speculation_slightly_slower_is_switched_off() -> None:
    """The band is above target-only: a mode measured losing, however little, is not kept."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 100, spec_tok_s=99, plain_tok_s=100)
    assert not bucket(switch, 1).speculating


def test_rates_within_the_band_do_not_flip_the_mode() -> None:
    inside = 100 * (OFF_BELOW + ON_ABOVE) / 2
    on = SpeculationSwitch(enabled=True)  # starts speculating: stays
    run_steps(on, 300, spec_tok_s=inside, plain_tok_s=100)
    off = SpeculationSwitch(enabled=True)  # made to stop, then speculation gets a little better
    run_steps(off, 20, spec_tok_s=50, plain_tok_s=100)
    run_steps(off, 300, spec_tok_s=inside, plain_tok_s=100)
    assert (on.num_switches, off.num_switches) == (0, 1)
    assert bucket(on, 1).speculating and not bucket(off, 1).speculating


def test_a_drafter_that_gets_better_is_switched_back_on() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 100, spec_tok_s=40, plain_tok_s=100)
    modes = run_steps(switch, 300, spec_tok_s=300, plain_tok_s=100)
    # Back on at the next probe, whose own steps outweigh the slow ones of earlier probes. The
    # probe before the change lost by CLEAR, so the next one came 4x later, not 2x.
    assert all(modes[modes.index(True) :][:FIRST_PROBE_AFTER])
    assert modes.index(True) <= 8 * FIRST_PROBE_AFTER + PROBE_STEPS
    assert sum(modes[-100:]) >= 100 - PROBE_STEPS and switch.num_switches == 2


def test_one_slow_step_does_not_decide_a_bucket() -> None:
    """A first replay that captures a graph, a collection: the median of a few steps decides."""
    switch = SpeculationSwitch(enabled=True)
    switch.speculate_next(1)
    switch.record(1, True, tokens=1, seconds=1.0)  # speculation's first step: 100x slower
    modes = run_steps(switch, 100, spec_tok_s=300, plain_tok_s=100)
    assert switch.num_switches == 0 and sum(modes) >= 100 - 2 * PROBE_STEPS


def test_steps_with_a_catch_up_are_counted_but_not_measured() -> None:
    """A probe of speculation first catches drafters up (unclean steps): it ends within its
    budget even when no clean step comes, and its unclean steps set no rate."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 20, spec_tok_s=40, plain_tok_s=100)  # off, next probe after 16 steps
    while not switch.speculate_next(1):
        run_steps(switch, 1, spec_tok_s=40, plain_tok_s=100)
    probe = run_steps(switch, PROBE_BUDGET + 5, spec_tok_s=1000, plain_tok_s=100, clean=False)
    assert probe == [True] * PROBE_BUDGET + [False] * 5
    assert bucket(switch, 1).speculative_tok_s == 40 and switch.num_switches == 1


def test_batch_sizes_are_measured_apart() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 50, spec_tok_s=300, plain_tok_s=100, batch=1)
    run_steps(switch, 50, spec_tok_s=100, plain_tok_s=300, batch=20)
    by_size = {b.batch_size: b.speculating for b in switch.status().buckets}
    assert by_size == {1: True, 32: False}


def test_a_new_bucket_starts_from_its_nearest_decided_neighbour() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 50, spec_tok_s=300, plain_tok_s=100, batch=1)  # wins at 1
    run_steps(switch, 50, spec_tok_s=100, plain_tok_s=300, batch=16)  # loses at 16
    # Just switched back on at 1: the last step speculated, yet 8 is nearer to 16.
    assert switch.speculate_next(8) is False
    assert switch.speculate_next(2) is True
    # Then it measures for itself: the other mode early.
    modes = run_steps(switch, MIN_SAMPLES + SPEC_PROBE_STEPS + 4, spec_tok_s=300, plain_tok_s=100,
                      batch=8)  # fmt: skip
    probe = SPEC_PROBE_STEPS
    assert modes[: MIN_SAMPLES + probe] == [False] * MIN_SAMPLES + [True] * probe
    assert all(modes[MIN_SAMPLES:]) and bucket(switch, 8).speculating


def test_without_neighbours_a_new_bucket_starts_in_the_running_mode() -> None:
    """No transition to pay for before anything is known: the mode of the last step."""
    switch = SpeculationSwitch(enabled=True)
    switch.record(64, False, tokens=640, seconds=1.0)  # a bucket with one mode measured only
    assert switch.speculate_next(32) is False


def test_status_reports_each_bucket() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 60, spec_tok_s=40, plain_tok_s=100, batch=3)
    status = switch.status()
    assert status.enabled and status.num_switches == 1 and status.num_probes == 2
    (b,) = status.buckets
    assert (b.batch_size, b.speculating, b.num_switches, b.num_probes) == (4, False, 1, 2)
    spec_steps = SPEC_MIN_ROUNDS + SPEC_CLEAR_STEPS  # the first rounds, a probe 32 steps later
    assert (b.speculative_steps, b.target_only_steps) == (spec_steps, 60 - spec_steps)
    assert not b.probing


def test_one_round_that_accepted_nothing_does_not_end_a_probe() -> None:
    """A speculative step commits 1 to 9 tokens: a probe's first step can be a round that
    accepted no draft (0.2x) where speculation runs at 0.84x (the H200, 2026-12-03). The
    probe goes on past it, and its verdict then leaves larger batches free to measure."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, SPEC_MIN_ROUNDS + CLEAR_STEPS, spec_tok_s=40, plain_tok_s=890)
    assert not bucket(switch, 1).speculating
    rates = [250.0, 400.0] + [900.0, 950.0, 920.0, 960.0] * ((SPEC_PROBE_STEPS - 2) // 4) + [
        930.0
    ] * ((SPEC_PROBE_STEPS - 2) % 4)
    probe_rates = iter(rates)
    spec_steps = 0
    for _ in range(4 * FIRST_PROBE_AFTER):
        speculative = switch.speculate_next(1)
        rate = next(probe_rates) if speculative else 890.0
        switch.record(1, speculative, tokens=int(rate), seconds=1.0)
        spec_steps += speculative
    assert spec_steps == SPEC_PROBE_STEPS  # not ended by its first steps' 0.3x and 0.45x
    b = bucket(switch, 1)
    # All the probe's rounds count, and only they: the two before it were CLEAR slower.
    assert not b.speculating and b.speculative_tok_s == statistics.fmean(int(r) for r in rates)
    assert switch.implied(4) is None  # a 0.9x verdict holds no larger bucket


def test_a_rate_is_mean_tokens_over_the_median_step_time() -> None:
    """Rounds commit skewed token counts in about the same time: the median of per-step
    rates would say 400 tok/s here where 880 were committed a second; one slow step (a
    collection) moves the median time, not the rate."""
    switch = SpeculationSwitch(enabled=True)
    for tokens, seconds in [(1, 0.005), (2, 0.005), (2, 0.005), (9, 0.005), (8, 0.5)]:
        switch.record(1, True, tokens=tokens, seconds=seconds)
    assert bucket(switch, 1).speculative_tok_s == pytest.approx(4.4 / 0.005)


VERIFY_S, DECODE_S = 0.090, 0.042  # a CPU round (16-node tree) and a target-only step
ALWAYS = (1.5 + 6) / 2 / VERIFY_S  # committed tokens a second when always speculating


def reply_in_runs(steps: int, slow_first: bool) -> tuple[int, float]:
    """A reply whose rounds accept in runs of 30: 1-2 tokens (0.7x target-only), then 5-7
    (2.9x), 1.75x on the whole. Returns the speculative steps and the tokens a second."""
    switch = SpeculationSwitch(enabled=True)
    tokens = seconds = speculative_steps = rounds = 0
    for _ in range(steps):
        speculative = switch.speculate_next(1)
        if speculative:
            slow = (rounds // 30) % 2 != slow_first
            run = (1, 2) if slow else (5, 6, 7)
            committed, took = run[rounds % len(run)], VERIFY_S
            rounds += 1
        else:
            committed, took = 1, DECODE_S
        switch.record(1, speculative, tokens=committed, seconds=took)
        tokens, seconds = tokens + committed, seconds + took
        speculative_steps += speculative
    return speculative_steps, tokens / seconds


def test_runs_of_slow_rounds_do_not_turn_a_winning_drafter_off() -> None:
    """Judged on its newest 8 rounds, the switch turned speculation off in a slow run and held
    it off for hundreds of steps (109 of these 3000 steps speculated, 1.06x target-only; now
    2978, 1.76x); a CPU `splitspec serve` lost a quarter of its speedup so (1.25x against 1.58x
    always speculating, held-out ShareGPT, 2026-12-05)."""
    speculative_steps, rate = reply_in_runs(3000, slow_first=False)
    assert speculative_steps >= 0.9 * 3000
    assert rate >= 0.9 * ALWAYS


def test_a_reply_opening_with_slow_rounds_does_not_turn_a_winning_drafter_off() -> None:
    """Judged on its first 2 rounds, a bucket whose reply opened with a slow run probed
    target-only at once and left speculation: 20 of 400 steps speculated, 0.97x target-only
    (now 173, 1.44x; over 3000 steps 1.50x, now 1.72x)."""
    speculative_steps, rate = reply_in_runs(400, slow_first=True)
    assert speculative_steps >= 150
    assert rate >= 1.3 / DECODE_S


def test_a_mode_under_probe_reports_its_kept_rate_until_the_probe_measures() -> None:
    """GetServerStatus read 0 tok/s for speculation from a probe's start to its first clean
    round; the rounds it keeps are what the switch knows then."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, SPEC_MIN_ROUNDS + CLEAR_STEPS, spec_tok_s=40, plain_tok_s=100)
    for _ in range(4 * FIRST_PROBE_AFTER):
        if bucket(switch, 1).probing:
            break
        run_steps(switch, 1, spec_tok_s=40, plain_tok_s=100)
    b = bucket(switch, 1)
    assert b.probing and not b.speculating
    assert (b.speculative_tok_s, b.target_only_tok_s) == (40, 100)
