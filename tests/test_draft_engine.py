"""The draft service's pieces without gRPC: the scripted drafter's rule, the n-gram adapter's
positions, and the engine's round bookkeeping (retries, batched appends, a request that is held
but not ready, overload). The service as a real process: test_draft_service.py."""

from __future__ import annotations

import pytest

from draft_service.drafter import ContextChunk, ContextMismatch, TreeShape
from draft_service.ngram_drafter import NgramContextDrafter
from draft_service.servicer import DraftEngine, DraftOverloaded, InvalidDraftInput, RoundItem
from draft_service.test_drafters import script_continuation

REPEATING = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # ngram drafts 4, 1, 2, 3, 4 after it


def test_script_rule() -> None:
    scripts = [[1, 2, 3, 1, 2, 4, 5], [7, 1, 2, 9]]
    assert script_continuation(scripts, [3, 1, 2], 2) == [4, 5]  # k = 3 beats k = 2
    assert script_continuation(scripts, [1, 2], 2) == [3, 1]  # tie: first script, smaller end
    assert script_continuation(scripts, [7, 1, 2], 5) == [9]  # second script aligns longer
    assert script_continuation(scripts, [8], 3) == []
    assert script_continuation(scripts, [4, 5], 3) == []  # aligned at the script's end


def test_ngram_adapter_positions() -> None:
    drafter = NgramContextDrafter(TreeShape(num_steps=3, topk=2, num_draft_tokens=4))
    with pytest.raises(ContextMismatch):
        drafter.append(ContextChunk("r", 2, [1]))
    drafter.append(ContextChunk("r", 0, []))  # held with no tokens yet (hidden-only first chunk)
    assert drafter.num_tokens("r") == 0
    drafter.append(ContextChunk("r", 0, [5, 6, 5]))
    with pytest.raises(ContextMismatch):
        drafter.append(ContextChunk("r", 2, [6]))
    (tree,) = drafter.propose(["r"])
    assert tree.token_ids == [5, 6, 5, 6] and tree.num_nodes <= 4
    assert drafter.release("r") and not drafter.release("r")


def test_engine_rounds_without_grpc() -> None:
    engine = DraftEngine(NgramContextDrafter(TreeShape()))
    first = engine.propose([RoundItem(ContextChunk("r", 0, REPEATING), 0)])
    assert engine.propose([RoundItem(ContextChunk("r", 0, REPEATING), 0)]) == first
    with pytest.raises(InvalidDraftInput):
        engine.propose([RoundItem(ContextChunk("r", 0, [1]), 0)])
    assert engine.propose([RoundItem(ContextChunk("r", 0, REPEATING), 1)]) == [None]
    assert engine.ingest([ContextChunk("r", 0, [1, 2])]).num_tokens == 2
    assert engine.propose([RoundItem(ContextChunk("r", 2, [1]), 0)])[0] is not None
    assert engine.release(["r", "r"]) == 1


class _PoolFull(RuntimeError):
    pass


class BatchingDrafter(NgramContextDrafter):
    """Like EagleDrafter: batched appends, and propose fails the batch for a request that is
    held but not ready."""

    def __init__(self) -> None:
        super().__init__(TreeShape())
        self.not_ready: set[str] = set()
        self.append_calls = 0

    def append_many(self, chunks: list[ContextChunk]) -> list[str]:
        self.append_calls += 1
        if any(999 in c.token_ids for c in chunks):
            raise _PoolFull("no room")
        mismatched = []
        for chunk in chunks:
            try:
                self.append(chunk)
            except ContextMismatch:
                mismatched.append(chunk.request_id)
        return mismatched

    def propose(self, request_ids):
        if self.not_ready & set(request_ids):
            raise ContextMismatch("not ready")
        return super().propose(request_ids)


def test_engine_batches_appends_and_isolates_unready_requests() -> None:
    drafter = BatchingDrafter()
    engine = DraftEngine(drafter, overload_errors=(_PoolFull,))
    drafter.not_ready.add("b")
    trees = engine.propose([RoundItem(ContextChunk(rid, 0, REPEATING), 0) for rid in "abc"]
                           + [RoundItem(ContextChunk("d", 4, [1]), 0)])
    assert drafter.append_calls == 1
    assert [t is None for t in trees] == [False, True, False, True]
    assert trees[0] == trees[2] and trees[0] is not None and trees[0].token_ids[:2] == [3, 4]
    with pytest.raises(DraftOverloaded):
        engine.propose([RoundItem(ContextChunk("e", 0, [999]), 0)])
