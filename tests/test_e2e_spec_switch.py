"""--adaptive-speculation on a real stack: with a drafter that accepts nothing (a random EAGLE
head on the tiny model) the router measures speculative rounds losing to target-only steps and
switches speculation off at that batch size, probing it now and then; greedy outputs stay
exactly target-only's. The same stack's GetServerStatus shows where both kinds of step spent
their time. At batch 4 on a target that runs 4 decode steps per Forward, the switched-off mode
is target-only's own: multi-step Forwards. (router/spec_switch.py; its unit tests:
tests/test_spec_switch.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.spec_bucket import SPEC_MIN_ROUNDS
from splitspec.status_report import status_lines
from tests.helpers.rpc import BackgroundStream
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
    router_args = ["--adaptive-speculation", "--log-level", "debug"]
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
    # --log-level debug: a line per step. A target-only step straight after a speculative one
    # waits for the Propose that one sent ahead: a transition, left out of the rates.
    steps = re.findall(r"step: batch 1, (\S+), \d+ tokens in [\d.]+ ms, (.+)$",
                       (tmp_path / "router.log").read_text(), re.MULTILINE)  # fmt: skip
    modes = [mode for mode, _ in steps]
    after_spec = [steps[i][1] for i in range(1, len(steps))
                  if modes[i] == "target-only" and modes[i - 1] == "speculative"]  # fmt: skip
    assert after_spec and set(after_spec) == {"not measured"}, steps
    assert ("target-only", "measured") in steps
    # The drafter's own measure of its work, reported in its replies. The call itself may have
    # left in the step before (router/draft_ahead.py), so only its wait is in the step.
    assert 0 < speculative.draft_compute_ms < speculative.step_ms
    assert plain.draft_compute_ms == 0


def test_switched_off_steps_are_target_only_multi_step_forwards(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Four concurrent streams that speculate where the router finds it pays, then the same
    four target-only: the switch learns the batch-4 bucket within a few rounds, its off steps
    run 4 decode steps per Forward like target-only's, and the outputs are target-only's."""
    prompts = random_prompts(seed=5, count=4, vocab_size=49152, max_len=40)
    target_args = ["--decode-steps", "4"]
    router_args = ["--adaptive-speculation"]
    stack_args = (tmp_path, tiny_model_dir, [RANDOM_HEAD], target_args, router_args)
    with running_stack(*stack_args) as (_, router):
        auto = router.generate_many([ids_request(p, 160, True, ignore_eos=True) for p in prompts])
        forwards = router.status().multi_step_forwards
        base = router.generate_many([ids_request(p, 160, False, ignore_eos=True) for p in prompts])
        status = router.status()
    for i, (a, b) in enumerate(zip(auto, base, strict=True)):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 160, f"prompt {i}"
    switch = status.speculation_switch
    four = next(b for b in switch.buckets if b.batch_size == 4)
    assert not four.speculating and four.speculative_steps >= 3 and four.target_only_steps >= 3
    assert 0 < four.speculative_tok_s < four.target_only_tok_s and four.num_probes >= 1
    # SPEC_MIN_ROUNDS rounds and a probe to learn; then 4 tokens per request per Forward, as
    # target-only gets.
    rounds = sum(a.final.speculation.verify_steps for a in auto)
    assert 0 < rounds <= 4 * (SPEC_MIN_ROUNDS + 12), rounds
    assert forwards >= 160 / 4 / 2, forwards


def test_a_step_that_ends_a_prompt_runs_target_only_under_the_switch(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A request arriving while another speculates gets its first token from a target-only
    step (its prefill beside one decode step of the other), not after a speculative round: the
    switch counts the held step. Outputs stay target-only's."""
    first, second = random_prompts(seed=11, count=2, vocab_size=49152, max_len=40)
    router_args = ["--adaptive-speculation"]
    with running_stack(tmp_path, tiny_model_dir, [RANDOM_HEAD], (), router_args) as (_, router):
        streaming = BackgroundStream(router, ids_request(first, 80, True, ignore_eos=True))
        streaming.wait_for_tokens(8)
        arrived = router.generate(ids_request(second, 8, True, ignore_eos=True))
        tokens = streaming.finish()
        status = router.status()
        holds = status.speculation_switch.num_prefill_holds
        base = [router.generate(ids_request(p, n, False, ignore_eos=True))
                for p, n in ((first, 80), (second, 8))]  # fmt: skip
    # The step that ended the second prompt; the first's own prefill had no one decoding.
    assert holds == 1
    assert "1 step held target-only" in "\n".join(status_lines("router", status))
    assert tokens == base[0].token_ids and arrived.token_ids == base[1].token_ids
