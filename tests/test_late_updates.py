"""A late Propose's update sent again, merged with the next (draft_service/late_updates.py): a
replica that applied it goes on from what it holds, with the trees of a replica that got the
two updates one round each; anything else still answers needs_context and changes nothing."""

from __future__ import annotations

import pytest
import torch

from draft_service.drafter import ContextChunk, TreeShape
from draft_service.eagle.drafter import EagleDrafter
from draft_service.ngram_drafter import NgramContextDrafter
from draft_service.servicer import DraftEngine, RoundItem
from tests.test_eagle_drafter import make_context
from tests.test_eagle_head import tiny_head

PROMPT, FIRST, SECOND = 20, 3, 2  # tokens ingested, then two rounds' updates


def chunk(ctx, lo: int, hi: int, with_rows: bool) -> ContextChunk:
    """Tokens lo..hi-1 and, for EAGLE, the target's rows one position behind them."""
    tokens, hidden = ctx
    rows = hidden[max(lo - 1, 0) : hi - 1] if with_rows else None
    return ContextChunk("r", lo, tokens[lo:hi], max(lo - 1, 0), rows)


def merged(a: ContextChunk, b: ContextChunk) -> ContextChunk:
    rows = None if a.hidden is None else torch.cat([a.hidden, b.hidden])
    return ContextChunk("r", a.start_pos, [*a.token_ids, *b.token_ids], a.hidden_start_pos, rows)


def eagle_engine() -> DraftEngine:
    head = tiny_head(seed=3, dtype=torch.float64)
    return DraftEngine(EagleDrafter(head, TreeShape(3, 2, 8), num_slots=256))


def ngram_engine() -> DraftEngine:
    return DraftEngine(NgramContextDrafter(TreeShape(3, 2, 8)))


@pytest.mark.parametrize("make_engine, with_rows", [(eagle_engine, True), (ngram_engine, False)])
def test_a_merged_update_after_a_late_call_goes_on_without_a_reingest(make_engine, with_rows):
    ctx = make_context(PROMPT + FIRST + SECOND + 1, seed=5)
    ctx = (ctx[0][: PROMPT + FIRST + SECOND], ctx[1])  # repeats help the n-gram drafter
    ctx[0][PROMPT:] = ctx[0][PROMPT - FIRST - SECOND : PROMPT]
    first = chunk(ctx, PROMPT, PROMPT + FIRST, with_rows)
    second = chunk(ctx, PROMPT + FIRST, PROMPT + FIRST + SECOND, with_rows)
    late, in_step = make_engine(), make_engine()
    for engine in (late, in_step):
        engine.ingest([chunk(ctx, 0, PROMPT, with_rows)])
        engine.propose([RoundItem(first, 1)])  # the late call: applied, its reply not waited for
    expected = in_step.propose([RoundItem(second, 3)])[0]
    got = late.propose([RoundItem(merged(first, second), 3)])[0]  # round 2 was root-only
    assert expected is not None and got == expected
    assert late.drafter.num_tokens("r") == in_step.drafter.num_tokens("r") == len(ctx[0])


@pytest.mark.parametrize("make_engine, with_rows", [(eagle_engine, True), (ngram_engine, False)])
def test_an_update_that_does_not_start_with_the_applied_one_still_needs_context(
    make_engine, with_rows
):
    ctx = make_context(PROMPT + FIRST + SECOND + 1, seed=6)
    first = chunk(ctx, PROMPT, PROMPT + FIRST, with_rows)
    second = chunk(ctx, PROMPT + FIRST, PROMPT + FIRST + SECOND, with_rows)
    engine = make_engine()
    engine.ingest([chunk(ctx, 0, PROMPT, with_rows)])
    engine.propose([RoundItem(first, 1)])
    other = merged(first, second)
    other.token_ids[0] = (other.token_ids[0] + 1) % 50  # not what was applied
    assert engine.propose([RoundItem(other, 2)]) == [None]
    assert engine.drafter.num_tokens("r") == PROMPT + FIRST  # nothing appended
    after_release = make_engine()  # a replica that forgot the request holds nothing to trim
    after_release.ingest([chunk(ctx, 0, PROMPT, with_rows)])
    after_release.propose([RoundItem(first, 1)])
    after_release.release(["r"])
    assert after_release.propose([RoundItem(merged(first, second), 2)]) == [None]
