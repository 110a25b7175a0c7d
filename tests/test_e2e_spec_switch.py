"""--adaptive-speculation on a real stack: with a drafter that accepts nothing (a random EAGLE
head on the tiny model) the router measures speculative rounds losing to target-only steps and
switches speculation off at that batch size, probing it now and then; greedy outputs stay
exactly target-only's. The same stack's GetServerStatus shows where both kinds of step spent
their time. (router/spec_switch.py; its unit tests: tests/test_spec_switch.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(240)
RANDOM_HEAD = ["--method", "eagle", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "8"]


def test_a_losing_drafter_is_switched_off_and_outputs_do_not_change(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    prompts = random_prompts(seed=3, count=3, vocab_size=49152)
    router_args = ["--adaptive-speculation"]
    with running_stack(tmp_path, tiny_model_dir, [RANDOM_HEAD], (), router_args) as (_, router):
        spec = [router.generate(ids_request(p, 120, True, ignore_eos=True)) for p in prompts]
        base = [router.generate(ids_request(p, 120, False, ignore_eos=True)) for p in prompts]
        status = router.status()
    for i, (s, b) in enumerate(zip(spec, base, strict=True)):
        assert s.token_ids == b.token_ids and len(s.token_ids) == 120, f"prompt {i}"
    switch = status.speculation_switch
    one = next(b for b in switch.buckets if b.batch_size == 1)
    assert switch.enabled and switch.num_switches >= 1
    assert 0 < one.speculative_tok_s < one.target_only_tok_s and not one.speculating
    # It speculated at first and when probing, but most steps ran target-only.
    rounds = sum(s.final.speculation.verify_steps for s in spec)
    assert 0 < rounds < 3 * 120 / 2, rounds
    # Where the steps' time went, both kinds of step having run (router/step_timing.py).
    plain, speculative = status.target_only_steps, status.speculative_steps
    assert plain.steps > 0 and speculative.steps > 0
    for t in (plain, speculative):
        assert t.step_ms >= t.target_call_ms >= t.target_compute_ms > 0
    assert speculative.draft_call_ms > 0 and plain.draft_call_ms < speculative.draft_call_ms
    # The drafter's own measure of its work, reported in its replies, fits inside the call.
    assert 0 < speculative.draft_compute_ms < speculative.draft_call_ms
    assert plain.draft_compute_ms == 0
