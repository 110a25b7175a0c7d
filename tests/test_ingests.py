"""router/ingests.py against a real gRPC DraftModel: an Ingest is sent off and the step goes on;
what the request's draft state says while the call is out, after it ends, after the request
moved on meanwhile, was retracted, or its rows could not be read.

The drafter here is a gRPC server whose Ingest ends only when the test lets it, so "the step
goes on" is checked as "``begin`` returned while the drafter still holds the call"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import grpc
import pytest

from protos import draft_pb2, draft_pb2_grpc
from router.catch_up import CatchUp
from router.draft_pool import DraftPool
from router.ingests import Ingests
from router.request import Request, SamplingOptions
from tests.test_catch_up import Target

pytestmark = pytest.mark.timeout(60)
PROMPT = 40


class GatedDraft(draft_pb2_grpc.DraftModelServicer):
    """Takes every chunk, then holds the call until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.chunks: list[draft_pb2.IngestChunk] = []
        self.calls = 0

    async def Ingest(self, request_iterator, context):  # noqa: N802 (gRPC naming)
        self.calls += 1
        async for chunk in request_iterator:
            self.chunks.append(chunk)
        await self.gate.wait()
        return draft_pb2.IngestResponse(num_tokens=1)


def prefilled(rid: str) -> Request:
    """A request right after its prefill: the prompt computed, the first token its root."""
    req = Request(rid, list(range(100, 100 + PROMPT)), SamplingOptions(max_new_tokens=64))
    req.output_ids = [7]
    req.num_computed = PROMPT
    return req


Scenario = Callable[[Ingests, GatedDraft, Target, DraftPool], Awaitable[None]]


def run(scenario: Scenario, target: Target | None = None, lost: list | None = None) -> None:
    """``scenario`` against a gated drafter; replicas reported lost go to ``lost``."""
    lost = [] if lost is None else lost

    async def main() -> None:
        server, draft = grpc.aio.server(), GatedDraft()
        draft_pb2_grpc.add_DraftModelServicer_to_server(draft, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        pool = DraftPool([f"127.0.0.1:{port}"], timeout_s=10.0)
        replica = pool.replicas[0]
        replica.healthy, replica.info = True, SimpleNamespace(needs_hidden=True)
        the_target = target or Target()
        try:
            ingests = Ingests(pool, the_target, lambda r, why: lost.append((r, why)))
            await scenario(ingests, draft, the_target, (pool, server))
        finally:
            draft.gate.set()
            await pool.close()
            await server.stop(None)

    asyncio.run(main())


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.005)


def test_begin_returns_while_the_drafter_holds_the_call() -> None:
    async def scenario(ingests: Ingests, draft: GatedDraft, target: Target, _) -> None:
        req = prefilled("a")
        task = await ingests.begin(req)
        assert task is not None and ingests.busy(req)
        # The rows were read before the call left, in the target's 3-row chunks.
        assert target.reads == [("a", 0, PROMPT)]
        await until(lambda: len(draft.chunks) == -(-PROMPT // 3))  # all in; the call is held
        assert not task.done() and not req.draft_synced
        updates = [c.update for c in draft.chunks]
        assert [t for u in updates for t in u.token_ids] == req.context_ids[: PROMPT + 1]
        assert sum(u.hidden.shape[0] for u in updates) == PROMPT
        draft.gate.set()
        assert await ingests.settle_all()
        assert req.draft_synced and req.draft_end == PROMPT and not ingests.busy(req)
        assert not await ingests.settle_all()  # nothing out any more

    run(scenario)


def test_tokens_committed_meanwhile_come_as_an_update() -> None:
    async def scenario(ingests: Ingests, draft: GatedDraft, target: Target, pool_server) -> None:
        pool = pool_server[0]
        req = prefilled("a")
        await ingests.begin(req)
        req.output_ids.append(8)  # a target-only step while the call is out
        req.num_computed += 1
        draft.gate.set()
        await ingests.settle([req])
        assert not req.draft_synced and req.draft_end == PROMPT
        catching_up = CatchUp(pool, target, max_per_step=4, lose_replica=None)
        catching_up.ingests = ingests
        await catching_up.run([req])
        assert draft.calls == 1, "caught up by a second Ingest, not by update"
        update = req.pending_update
        assert req.draft_synced and update.start_pos == PROMPT + 1
        assert list(update.token_ids) == [8] and update.hidden_start_pos == PROMPT
        assert target.reads[-1] == ("a", PROMPT, PROMPT + 1)

    run(scenario)


def test_settle_waits_for_the_named_requests_only() -> None:
    async def scenario(ingests: Ingests, draft: GatedDraft, *_) -> None:
        a, b = prefilled("a"), prefilled("b")
        await ingests.begin(a)
        await ingests.begin(b)
        settling = asyncio.create_task(ingests.settle([a]))
        await asyncio.sleep(0.05)
        assert not settling.done(), "settle returned while the Ingest was out"
        draft.gate.set()
        await settling
        assert not ingests.busy(a)
        await ingests.settle_all()
        assert not ingests.busy(b)

    run(scenario)


def test_a_request_retracted_meanwhile_keeps_its_reset_state() -> None:
    async def scenario(ingests: Ingests, draft: GatedDraft, *_) -> None:
        req = prefilled("a")
        await ingests.begin(req)
        req.num_retractions += 1  # as router/retraction.py leaves it: ingested whole again
        req.num_computed, req.draft_end = 0, -1
        draft.gate.set()
        await ingests.settle_all()
        assert not req.draft_synced and req.draft_end == -1

    run(scenario)


class FailingTarget(Target):
    async def read_hidden(self, request_id: str, start: int, end: int) -> AsyncIterator:
        self.reads.append((request_id, start, end))
        raise grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, None, None, "no such request")
        yield  # an async generator, as the target client's


def test_unread_rows_send_nothing_and_leave_it_for_a_later_step() -> None:
    async def scenario(ingests: Ingests, draft: GatedDraft, target: Target, _) -> None:
        req = prefilled("a")
        assert await ingests.begin(req) is None
        assert target.reads and draft.calls == 0 and not ingests.busy(req)
        assert not req.draft_synced and req.draft_end == -1

    run(scenario, FailingTarget())


def test_a_replica_lost_while_its_ingest_is_out_leaves_the_request_target_only() -> None:
    lost: list = []

    async def scenario(ingests: Ingests, draft: GatedDraft, target: Target, pool_server) -> None:
        pool, server = pool_server
        req = prefilled("a")
        await ingests.begin(req)
        await until(lambda: draft.calls == 1)
        await server.stop(None)  # the replica's process goes away mid-call
        await ingests.settle([req])
        assert not ingests.busy(req) and not req.draft_synced and req.draft_end == -1
        assert [r for r, _ in lost] == [pool.replicas[0]], lost

    run(scenario, lost=lost)

