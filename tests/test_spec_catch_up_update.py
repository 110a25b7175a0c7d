"""A drafter left behind by target-only steps catches up by update (router/catch_up.py).

With --max-speculative-batch 1, request A speculates alone, then runs target-only steps while B
decodes beside it, then speculates again. Its recording drafter must have received the spell as
one continuing update (A's context is never restarted by an Ingest), carrying the target's real
hidden rows of those positions from its pool, and A's output is the same either way.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    GENERATE_TIMEOUT_S,
    ids_request,
    running_stack,
    tiny_model_dir_fixture,
)
from tests.test_spec_catch_up import Env, read_record, row_sums

pytestmark = pytest.mark.timeout(180)  # a hung service fails this module's test, not the run
ROUND_MAX_TOKENS = 6  # the CPU tree (5 steps) accepts at most 5 drafts and a bonus token a round
SPELL_AFTER = 16  # A's tokens before B joins
B_TOKENS = 24


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Env]:
    log_dir = tmp_path_factory.mktemp("catch-up-update")
    record_dir = log_dir / "records"
    drafts = [["--method", "recording", "--record-dir", str(record_dir)]]
    # One decoding request speculates, two take target-only steps: the spell under test. The
    # deadline floor as in test_spec_catch_up: a missed one would skip rounds, not the spell.
    router_args = ["--draft-deadline-floor", "5", "--max-speculative-batch", "1"]
    with running_stack(log_dir, tiny_model_dir, drafts, router_args=router_args) as (_, router):
        yield Env(router, record_dir, tiny_model_dir)


def generate_with_a_spell(env: Env, prompt: list[int], other: list[int]) -> list[int]:
    """A's output; B is sent once A has streamed SPELL_AFTER tokens, and finishes first."""
    request = ids_request(prompt, 160, True, request_id="spell-a", ignore_eos=True)
    out: list[int] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        b = None
        for item in env.router.stub.Generate(request, timeout=GENERATE_TIMEOUT_S):
            out += item.token_ids
            if b is None and len(out) >= SPELL_AFTER:
                other_request = ids_request(other, B_TOKENS, True, request_id="spell-b",
                                            ignore_eos=True)  # fmt: skip
                b = pool.submit(env.router.generate, other_request)
        assert b is not None and len(b.result().token_ids) == B_TOKENS
    return out


def test_a_target_only_spell_reaches_the_drafter_as_one_update(env: Env) -> None:
    rng = random.Random(31)
    prompt, other = ([rng.randrange(49152) for _ in range(n)] for n in (40, 12))
    out = generate_with_a_spell(env, prompt, other)
    alone = env.router.generate(ids_request(prompt, 160, False, ignore_eos=True)).token_ids
    assert out == alone, "catching up changed the output"

    record = read_record(env, "spell-a")
    assert record["num_starts"] == 1, "the drafter was ingested again instead of updated"
    assert record["num_mismatches"] == 0
    held = record["token_ids"]
    assert held == (prompt + out)[: len(held)]
    assert len(held) > len(prompt) + SPELL_AFTER + B_TOKENS, "A never speculated after the spell"
    updates = [c for c in record["chunks"] if c["start_pos"] > 0]
    assert max(c["num_tokens"] for c in updates) > ROUND_MAX_TOKENS, "no update held the spell"
    # Every row the drafter holds, the spell's from the target's pool included, is the target's.
    assert record["num_hidden_rows"] == len(held) - 1
    assert record["hidden_row_sums"] == pytest.approx(
        row_sums(env.model_dir, held[:-1]), rel=1e-9, abs=1e-9
    )
