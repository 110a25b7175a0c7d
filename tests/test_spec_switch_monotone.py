"""router/spec_switch.py, the rules that keep learning cheap under load (pure logic, rates given
by hand): a clear verdict at one batch size decides the buckets beyond it by monotonicity, so
only the boundary probes; a probe that lost clearly backs off faster; unclean steps (a request
finishing, a drafter catching up) set no rate yet do not starve the switch."""

from __future__ import annotations

import random

from router.spec_bucket import (
    BUCKETS,
    CLEAR,
    FIRST_PROBE_AFTER,
    IMPLIES,
    MAX_PROBE_AFTER,
    MIN_SAMPLES,
    SPEC_CLEAR_STEPS,
    SPEC_MIN_ROUNDS,
)
from router.spec_switch import SpeculationSwitch, bucket_of
from tests.test_spec_switch import bucket, run_steps


def probes_at(switch: SpeculationSwitch, size: int) -> int:
    return next((b.num_probes for b in switch.status().buckets if b.batch_size == size), 0)


def test_a_clear_loss_at_batch_2_means_no_probe_at_batch_16() -> None:
    """Speculation at 0.4x at batch 2: batch 16 starts target-only and never probes it, even
    after thousands of steps and however good its (never measured) speculation would be."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 40, spec_tok_s=40, plain_tok_s=100, batch=2)
    assert not bucket(switch, 2).speculating
    modes = run_steps(switch, 3000, spec_tok_s=10_000, plain_tok_s=100, batch=16)
    assert not any(modes)
    b = bucket(switch, 16)
    assert (b.num_probes, b.speculative_steps, b.num_switches) == (0, 0, 0)


def test_a_bucket_left_mid_probe_still_holds_the_larger_ones() -> None:
    """Batch 1 measures speculation (SPEC_MIN_ROUNDS steps), then one clean step of its target-only
    probe, and is never seen again (a warm-up): that step already shows a clear loss, so batch
    4 runs target-only from its first step and never probes."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, SPEC_MIN_ROUNDS + 1, spec_tok_s=70, plain_tok_s=100, batch=1)
    assert bucket(switch, 1).probing  # the probe wants more steps than it got
    assert not any(run_steps(switch, 200, spec_tok_s=40, plain_tok_s=100, batch=4))
    assert probes_at(switch, 4) == 0


def test_only_the_boundary_between_a_winner_and_a_loser_probes() -> None:
    """Speculation wins at 1 (3x) and loses at 4 (0.4x): 2 is the boundary and measures for
    itself; 8 and above run target-only from their first step and never probe."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 40, spec_tok_s=300, plain_tok_s=100, batch=1)
    run_steps(switch, 40, spec_tok_s=40, plain_tok_s=100, batch=4)
    for size in (8, 16, 32):
        assert not any(run_steps(switch, 300, spec_tok_s=40, plain_tok_s=100, batch=size))
        assert probes_at(switch, size) == 0
    run_steps(switch, 300, spec_tok_s=90, plain_tok_s=100, batch=2)
    assert probes_at(switch, 2) >= 3 and not bucket(switch, 2).speculating
    # Both ends keep probing: a change of acceptance shows there first.
    before = (probes_at(switch, 1), probes_at(switch, 4))
    run_steps(switch, 300, spec_tok_s=300, plain_tok_s=100, batch=1)
    run_steps(switch, 300, spec_tok_s=40, plain_tok_s=100, batch=4)
    assert probes_at(switch, 1) > before[0] and probes_at(switch, 4) > before[1]


def test_below_a_clear_winner_speculation_starts_on_and_stays() -> None:
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 40, spec_tok_s=100, plain_tok_s=300, batch=16)  # loses at 16
    run_steps(switch, 40, spec_tok_s=300, plain_tok_s=100, batch=4)  # wins at 4
    for size in (1, 2):
        assert all(run_steps(switch, 300, spec_tok_s=300, plain_tok_s=100, batch=size))
        assert probes_at(switch, size) == 0
    assert not switch.speculate_next(32)  # above the loser
    assert switch.speculate_next(8) is False  # between: its nearest decided neighbour, 16
    modes = run_steps(switch, 40, spec_tok_s=300, plain_tok_s=100, batch=8)
    assert modes[:MIN_SAMPLES] == [False] * MIN_SAMPLES
    assert all(modes[MIN_SAMPLES:][: 2 * FIRST_PROBE_AFTER]) and bucket(switch, 8).speculating


def test_a_close_verdict_decides_nothing_beyond_its_bucket() -> None:
    """Speculation at 0.9x at batch 2 is off there, but within IMPLIES of target-only: not
    clear enough to silence batch 8, which measures for itself."""
    assert 0.9 * IMPLIES > 1
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 60, spec_tok_s=90, plain_tok_s=100, batch=2)
    assert not bucket(switch, 2).speculating
    run_steps(switch, 60, spec_tok_s=90, plain_tok_s=100, batch=8)
    assert probes_at(switch, 8) >= 1


def test_a_boundary_that_moves_frees_the_buckets_it_held() -> None:
    """Speculation loses clearly at 1, so 4 holds target-only; then the drafter gets better:
    1's next probe finds it winning, and 4 measures for itself again: its first probe is due
    (it has long had MIN_SAMPLES of target-only), so it comes after its first free step."""
    switch = SpeculationSwitch(enabled=True)
    run_steps(switch, 40, spec_tok_s=40, plain_tok_s=100, batch=1)
    assert not any(run_steps(switch, 100, spec_tok_s=300, plain_tok_s=100, batch=4))
    run_steps(switch, 300, spec_tok_s=300, plain_tok_s=100, batch=1)
    assert bucket(switch, 1).speculating
    modes = run_steps(switch, 40, spec_tok_s=300, plain_tok_s=100, batch=4)
    assert modes[:2] == [False, True] and bucket(switch, 4).speculating


def test_a_clear_loser_is_probed_far_less_often_than_a_close_one() -> None:
    """0.2x and 0.9x speculation over the same 1000 steps: the clear loser's probes back off
    x4 and take SPEC_CLEAR_STEPS steps each, the close one's x2 and three steps each."""
    spent = {}
    for ratio in (0.2, 0.9):
        switch = SpeculationSwitch(enabled=True)
        modes = run_steps(switch, 1000, spec_tok_s=100 * ratio, plain_tok_s=100)
        spent[ratio] = (bucket(switch, 1).num_probes, sum(modes[SPEC_MIN_ROUNDS:]))
    assert 1 / 0.2 >= CLEAR > 1 / 0.9
    assert spent[0.2][0] < spent[0.9][0] and 2 * spent[0.2][1] <= spent[0.9][1], spent


def test_probe_intervals_grow_x4_after_a_clear_loss_up_to_the_cap() -> None:
    switch = SpeculationSwitch(enabled=True)
    modes = run_steps(switch, 3000, spec_tok_s=20, plain_tok_s=100)
    starts = [i for i in range(1, len(modes)) if modes[i] and not modes[i - 1]]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # The first verdict switched the mode (x2), each later probe lost by CLEAR (x4).
    first = 2 * FIRST_PROBE_AFTER
    expected = [min(first * 4**i, MAX_PROBE_AFTER) for i in range(1, len(gaps) + 1)]
    assert [g - SPEC_CLEAR_STEPS for g in gaps] == expected, gaps


def test_mostly_unclean_steps_still_decide() -> None:
    """Two steps of three finish a request (release RPCs, a last Forward cut short): they set
    no rate, yet the bucket settles from the clean third within its first probes."""
    switch = SpeculationSwitch(enabled=True)
    for i in range(60):
        speculative = switch.speculate_next(4)
        rate = 300 if speculative else 100
        switch.record(4, speculative, tokens=rate, seconds=1.0, clean=i % 3 == 2)
    b = bucket(switch, 4)
    assert b.speculating and (b.speculative_tok_s, b.target_only_tok_s) == (300, 100)


def test_clear_winners_always_lie_below_clear_losers() -> None:
    """Whatever the rates (here random, not even monotone, changing as it runs), only free
    buckets settle, so the verdicts that hold other buckets never contradict each other."""
    rnd = random.Random(7)
    switch = SpeculationSwitch(enabled=True)
    ratios = {}
    for step in range(20_000):
        if step % 500 == 0:
            ratios = {size: rnd.choice([0.3, 0.7, 0.95, 1.05, 1.2, 1.5, 3.0]) for size in BUCKETS}
        num_decoding = rnd.randrange(1, 40)
        speculative = switch.speculate_next(num_decoding)
        rate = 100 * ratios[bucket_of(num_decoding)] if speculative else 100
        switch.record(num_decoding, speculative, int(rate), 1.0, clean=rnd.random() < 0.7)
        verdicts = {s: b.verdict for s, b in switch._buckets.items() if b.verdict is not None}
        winners = [s for s, v in verdicts.items() if v >= IMPLIES]
        losers = [s for s, v in verdicts.items() if v * IMPLIES <= 1]
        assert max(winners, default=0) < min(losers, default=BUCKETS[-1] + 1), (step, verdicts)
    assert switch.status().num_probes > 10
