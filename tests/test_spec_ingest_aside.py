"""A target whose target-only steps decode several tokens (``--decode-steps 4``, as a GPU's
do): a new request's drafter takes its prompt while the request decodes one such step
(router/ingests.py), and speculation starts the step after, the drafter caught up by update.

The scripted replica (as in tests/test_spec_scripted.py) proposes the target's own greedy
continuation, so every round is accepted whole and each stream item is one step: the prefill's
token, then the 4 tokens of the target-only step beside the Ingest, then whole rounds. With
one decode step a Forward (the CPU default) the Ingest is waited for in its step and the first
round follows the prefill at once (tests/test_spec_scripted.py's streams).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    greedy_reference,
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
DECODE_STEPS = 4
NUM_DRAFT_TOKENS = 8
NUM_ROUNDS = 3
OPENING = [1, DECODE_STEPS]  # the prefill's token, the target-only step's beside the Ingest
MAX_NEW = sum(OPENING) + NUM_DRAFT_TOKENS * NUM_ROUNDS


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[Router, list[list[int]], list[list[int]]]]:
    prompts = random_prompts(seed=11, count=2, vocab_size=49152, max_len=60)
    expected = greedy_reference(tiny_model_dir, prompts, MAX_NEW)
    log_dir = tmp_path_factory.mktemp("spec-ingest-aside")
    script = log_dir / "script.json"
    script.write_text(json.dumps([p + e for p, e in zip(prompts, expected, strict=True)]))
    drafts = [["--method", "scripted", "--script", str(script),
               "--num-draft-tokens", str(NUM_DRAFT_TOKENS)]]  # fmt: skip
    # Blocks are asserted step by step: no Propose may miss an adaptive deadline (as in
    # tests/test_spec_scripted.py).
    with running_stack(
        log_dir,
        tiny_model_dir,
        drafts,
        ["--decode-steps", str(DECODE_STEPS)],
        router_args=["--draft-deadline-floor", "5"],
    ) as (_, router):
        yield router, prompts, expected


def test_the_ingest_runs_beside_one_multi_step_decode(env) -> None:
    router, prompts, expected = env
    assert router.status().decode_steps == DECODE_STEPS
    # One at a time: a request whose decode shared a Forward with the other's prefill would
    # decode one token beside its Ingest instead of DECODE_STEPS (seen on a busy box).
    spec = router.generate_each([ids_request(p, MAX_NEW, True, ignore_eos=True) for p in prompts])
    base = router.generate_each([ids_request(p, MAX_NEW, False, ignore_eos=True) for p in prompts])
    for k, (s, b) in enumerate(zip(spec, base, strict=True)):
        assert b.token_ids == expected[k] == s.token_ids
        assert s.text == b.text
        assert [len(block) for block in s.blocks] == OPENING + [NUM_DRAFT_TOKENS] * NUM_ROUNDS
        stats = s.final.speculation
        assert stats.verify_steps == NUM_ROUNDS
        assert stats.accepted_tokens == stats.draft_tokens == NUM_ROUNDS * (NUM_DRAFT_TOKENS - 1)
