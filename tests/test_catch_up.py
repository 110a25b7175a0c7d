"""router/catch_up.py without services: which requests are caught up by update and which are
ingested, what an update holds, and what a failed read leaves (the end-to-end path, through a
real stack, is tests/test_spec_catch_up_update.py)."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import grpc
import pytest

from protos import target_pb2, tensor_pb2
from router import catch_up
from router.catch_up import MAX_UPDATE_ROWS, CatchUp
from router.request import Request, SamplingOptions

WIDTH = 2


class Target:
    """ReadHidden as the target streams it: 3-row chunks of rows whose values are positions."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.reads: list[tuple[str, int, int]] = []

    async def read_hidden(self, request_id: str, start: int, end: int):
        self.reads.append((request_id, start, end))
        if self.fail:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "target gone")
        for s in range(start, end, 3):
            rows = [float(p) for p in range(s, min(s + 3, end)) for _ in range(WIDTH)]
            data = struct.pack(f"<{len(rows)}f", *rows)
            shape = [len(rows) // WIDTH, WIDTH]
            hidden = tensor_pb2.Tensor(data=data, dtype="float32", shape=shape)
            yield target_pb2.HiddenChunk(start_pos=s, hidden=hidden)


def behind(rid: str, context: int, draft_end: int, needs_hidden: bool = True) -> Request:
    """A request of ``context`` tokens whose drafter holds tokens 0..draft_end."""
    req = Request(rid, list(range(100, 100 + context - 5)), SamplingOptions(max_new_tokens=500))
    req.output_ids = list(range(5))
    req.num_computed = context - 1  # the last token is the root: no KV yet
    req.draft_end, req.round = draft_end, 7
    info = SimpleNamespace(needs_hidden=needs_hidden)
    req.replica = SimpleNamespace(usable=True, info=info)
    return req


def run(reqs: list[Request], target: Target) -> list[str]:
    """Catches ``reqs`` up; returns the ids that went to a whole-context Ingest."""
    ingested: list[str] = []
    catching_up = CatchUp(pool=None, target=target, max_per_step=2, lose_replica=None)

    async def ingest(req: Request) -> None:
        ingested.append(req.request_id)

    catching_up.ingests.begin = ingest
    asyncio.run(catching_up.run(reqs))
    return ingested


def test_an_update_carries_the_missed_tokens_and_pool_rows() -> None:
    req = behind("a", context=60, draft_end=41)
    assert run([req], Target()) == []
    update = req.pending_update
    assert req.draft_synced and req.round == 8  # a round of its own
    assert update.start_pos == 42 and update.hidden_start_pos == 41
    assert list(update.token_ids) == req.context_ids[42:60]
    rows = struct.unpack(f"<{len(update.hidden.data) // 4}f", update.hidden.data)
    assert list(update.hidden.shape) == [18, WIDTH]
    assert rows[::WIDTH] == tuple(float(p) for p in range(41, 59))  # chunks joined in order


def test_an_ngram_drafter_gets_tokens_only() -> None:
    req, target = behind("a", context=30, draft_end=20, needs_hidden=False), Target()
    run([req], target)
    assert target.reads == [] and not req.pending_update.HasField("hidden")
    assert list(req.pending_update.token_ids) == req.context_ids[21:30]


def test_unknown_or_long_misses_are_ingested_a_few_a_step() -> None:
    unknown = [behind(f"u{i}", context=40, draft_end=-1) for i in range(3)]
    long_miss = behind("long", context=MAX_UPDATE_ROWS + 80, draft_end=10)
    short = behind("short", context=50, draft_end=45)
    assert run([*unknown, long_miss, short], Target()) == ["u0", "u1"]  # max_per_step
    assert short.draft_synced and not long_miss.draft_synced


def test_one_step_updates_at_most_the_row_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catch_up, "MAX_STEP_UPDATE_ROWS", 25)
    reqs = [behind(f"r{i}", context=60, draft_end=49) for i in range(4)]  # 10 rows each
    run(reqs, Target())
    assert [r.draft_synced for r in reqs] == [True, True, False, False]


def test_a_failed_read_leaves_the_request_for_an_ingest() -> None:
    req = behind("a", context=60, draft_end=41)
    run([req], Target(fail=True))
    assert not req.draft_synced and req.pending_update is None and req.draft_end == -1
    assert run([req], Target()) == ["a"]
