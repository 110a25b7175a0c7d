"""gRPC's race on a stream-unary call (router/ingests.py's Ingest): when the deadline passes
while the request iterator writes, the awaiting coroutine sometimes gets asyncio.CancelledError
instead of DEADLINE_EXCEEDED (about 1 in 11 on loopback). Raised on, it ended the scheduler's
loop and the router (CI, 2026-12-04). Here a real gRPC DraftModel that consumes chunks slowly
takes 320 Ingests with a 4 ms deadline: every one ends as an Ingest (done or missed), none
escapes; and a cancel of the task itself still cancels it."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import grpc
import pytest

from protos import draft_pb2, draft_pb2_grpc
from router.draft_pool import DraftPool
from router.ingests import Ingests
from router.replica_health import DeadlinePolicy, ReplicaHealth
from router.request import Request, SamplingOptions

pytestmark = pytest.mark.timeout(120)
DEADLINE_S = 0.004
TIGHT = DeadlinePolicy(floor_s=DEADLINE_S, cap_s=DEADLINE_S)  # every call's deadline: 4 ms


class SlowDraft(draft_pb2_grpc.DraftModelServicer):
    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    async def Ingest(self, request_iterator, context):  # noqa: N802 (gRPC naming)
        async for _ in request_iterator:
            await asyncio.sleep(random.random() * self.pause_s)
        return draft_pb2.IngestResponse(num_tokens=1)


async def ingested(ingests: Ingests, req: Request) -> None:
    """One Ingest, begun and awaited to its end."""
    task = await ingests.begin(req)
    if task is not None:
        await task


def behind(rid: str) -> Request:
    """A request of 3,000 tokens (three Ingest chunks) its replica does not hold yet."""
    req = Request(rid, list(range(3000)), SamplingOptions(max_new_tokens=8))
    req.num_computed = 2999
    req.draft_end = -1
    return req


async def ingest_all(pause_s: float, rounds: int, width: int) -> list[Request]:
    server = grpc.aio.server()
    draft_pb2_grpc.add_DraftModelServicer_to_server(SlowDraft(pause_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = DraftPool([f"127.0.0.1:{port}"], timeout_s=DEADLINE_S, deadline_floor_s=DEADLINE_S)
    replica = pool.replicas[0]
    ingests = Ingests(pool, target=None, lose_replica=None)
    done: list[Request] = []
    try:
        for r in range(rounds):
            # Fresh health each round: the misses would eject the replica and stop the calls.
            replica.healthy, replica.health = True, ReplicaHealth(TIGHT)
            replica.info = SimpleNamespace(needs_hidden=False)
            reqs = [behind(f"r{r}-{i}") for i in range(width)]
            for req in reqs:
                req.replica = replica
            await asyncio.gather(*(ingested(ingests, req) for req in reqs))
            done += reqs
    finally:
        await pool.close()
        await server.stop(None)
    return done


def test_ingests_racing_their_deadline_never_raise() -> None:
    reqs = asyncio.run(ingest_all(pause_s=0.003, rounds=40, width=8))
    assert len(reqs) == 320
    missed = [r for r in reqs if r.draft_end == -1]
    assert missed, "no Ingest missed its 4 ms deadline: the race was not exercised"
    assert all(r.draft_end in (-1, r.num_computed) for r in reqs)


def test_a_cancel_of_the_task_itself_still_cancels_it() -> None:
    async def scenario() -> None:
        server = grpc.aio.server()
        draft_pb2_grpc.add_DraftModelServicer_to_server(SlowDraft(pause_s=5.0), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        pool = DraftPool([f"127.0.0.1:{port}"], timeout_s=30.0)
        replica = pool.replicas[0]
        replica.healthy, replica.info = True, SimpleNamespace(needs_hidden=False)
        req = behind("stopped")
        req.replica = replica
        task = asyncio.create_task(ingested(Ingests(pool, None, None), req))
        await asyncio.sleep(0.2)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await pool.close()
            await server.stop(None)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("code", "elapsed_s", "lost"),
    [
        (grpc.StatusCode.INTERNAL, DEADLINE_S * 1.5, False),  # the race: a missed deadline
        (grpc.StatusCode.CANCELLED, DEADLINE_S, False),
        (grpc.StatusCode.INTERNAL, DEADLINE_S / 4, True),  # well inside its deadline: a loss
        (grpc.StatusCode.UNAVAILABLE, DEADLINE_S * 1.5, True),
    ],
)
def test_a_call_that_ran_its_deadline_out_is_a_miss_whatever_its_status(code, elapsed_s, lost):
    """gRPC can end an Ingest whose deadline passed mid-send as INTERNAL ("Failed
    execute_batch") instead of DEADLINE_EXCEEDED: that is a missed deadline, not a lost replica
    (which would drop it from rotation); the same status well inside the deadline is a loss."""
    losses: list[str] = []

    async def fail_one() -> tuple[Request, int]:
        pool = DraftPool(["127.0.0.1:1"], timeout_s=DEADLINE_S, deadline_floor_s=DEADLINE_S)
        replica, req = pool.replicas[0], behind("raced")
        ingests = Ingests(pool, None, lambda _replica, why: losses.append(why))
        err = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "Internal")
        ingests._failed(req, replica, err, DEADLINE_S, elapsed_s)
        await pool.close()
        return req, replica.health.misses

    req, misses = asyncio.run(fail_one())
    assert req.draft_end == -1
    assert bool(losses) == lost, losses
    assert misses == (0 if lost else 1)
