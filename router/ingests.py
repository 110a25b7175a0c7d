"""Whole-context Ingests, sent while the request decodes one target-only step.

An Ingest (router/catch_up.py says when one is needed: after a prefill, a lost replica, a long
target-only spell) used to hold the whole step: every running request waited for the drafter to
take a context before anything was verified or decoded. On the H100 (2026-12-05) the first
round after a prompt took 11.6-16.7 ms for one token, of which the Ingest 6.5-8.9 ms, against
4.7 ms for a round and 8 tokens in 8.8 ms for a target-only step.

So only the part that needs the target's turn runs inline: the request's hidden rows, read from
the target's pool (one ReadHidden, cheap next to the Ingest itself). The call to the drafter
then runs as a task of its own while the step goes on, the request in it target-only (not
``draft_synced`` yet), which loses nothing: a target-only step commits the target's own tokens.
The next speculative step waits for what is still out (``settle_all``), then catches the
drafter up with that one step's tokens by update (router/catch_up.py) and drafts: the same
steps every time, whatever the two calls' timing. The scheduler does this only where a
target-only step decodes several tokens (router/scheduler.py ``_catch_up``); with one token a
step it waits for the Ingest in the step that began it, as before.

What it removes is the wait of every other running request: on an H100 under Poisson arrivals
of 20 and 60 requests a second, requests ended 3-4% sooner (docs/gpu-history.md, 2026-12-05).
At batch 1 it measured no gain: the target's and the drafter's processes time-slice one GPU,
so only host work overlaps (a drafter on a device of its own would overlap the whole call).

A request that ends while its Ingest is out waits for it (``settle``) before its releases go,
so that a drafter never takes a context after its Release.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

import grpc

from protos import draft_pb2
from router import telemetry
from router.draft_pool import DraftPool, DraftReplica
from router.request import Request
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
INGEST_TOKENS_PER_CHUNK = 1024


class Ingests:
    def __init__(
        self,
        pool: DraftPool,
        target: TargetClient,
        lose_replica: Callable[[DraftReplica, str], None],
    ) -> None:
        self.pool = pool
        self.target = target
        self.lose_replica = lose_replica
        self.in_flight: dict[str, asyncio.Task] = {}

    def busy(self, req: Request) -> bool:
        """Whether ``req``'s Ingest is still out."""
        return req.request_id in self.in_flight

    async def begin(self, req: Request) -> asyncio.Task | None:
        """Reads what the drafter needs and sends it off; returns the call's task (None: no
        replica for it, or the target's rows could not be read: a later step tries again)."""
        replica = self._placed(req)
        if replica is None:
            return None
        last = req.num_computed  # the root's position: its KV and hidden row do not exist yet
        chunks = await self._context(req, replica, last)
        if chunks is None:
            return None
        # Its number now: the task starts later, after the step may have retracted it.
        retractions = req.num_retractions
        task = asyncio.create_task(self._send(req, replica, chunks, last, retractions))
        rid = req.request_id
        self.in_flight[rid] = task
        task.add_done_callback(functools.partial(self._done, rid))
        return task

    def _done(self, request_id: str, task: asyncio.Task) -> None:
        if self.in_flight.get(request_id) is task:  # not a later Ingest of a reused id
            del self.in_flight[request_id]
        if not task.cancelled() and task.exception() is not None:  # settle does not raise it
            log.error("the Ingest of %s failed: %r", request_id, task.exception())

    async def settle_all(self) -> bool:
        """Waits for every Ingest still out; returns whether any was."""
        tasks = list(self.in_flight.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        return bool(tasks)

    async def settle(self, reqs: list[Request]) -> None:
        """Waits for the Ingests still out for ``reqs`` (before their releases)."""
        tasks = [self.in_flight[r.request_id] for r in reqs if r.request_id in self.in_flight]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _placed(self, req: Request) -> DraftReplica | None:
        """The request's replica: its own while usable, else one the pool assigns."""
        if req.replica is not None and not req.replica.usable:
            self.pool.move_away(req.replica, req.request_id)
            req.replica = None
        if req.replica is None:
            req.replica, req.draft_end = self.pool.assign(req.request_id), -1
        return req.replica

    async def _context(
        self, req: Request, replica: DraftReplica, last: int
    ) -> list[draft_pb2.IngestChunk] | None:
        """Tokens 0..last and, for EAGLE, hidden rows 0..last-1 from the target's pool, in
        chunks after each of which the replica holds one more token than hidden rows."""
        tokens = req.context_ids[: last + 1]
        rid = req.request_id
        if not (replica.info and replica.info.needs_hidden):
            return [
                draft_pb2.IngestChunk(update=draft_pb2.ContextUpdate(
                    request_id=rid, start_pos=s, token_ids=tokens[s : s + INGEST_TOKENS_PER_CHUNK]))
                for s in range(0, last + 1, INGEST_TOKENS_PER_CHUNK)
            ]  # fmt: skip
        chunks = []
        try:
            async for chunk in self.target.read_hidden(rid, 0, last):
                s, rows = chunk.start_pos, chunk.hidden.shape[0]
                first = 0 if s == 0 else s + 1
                update = draft_pb2.ContextUpdate(
                    request_id=rid,
                    start_pos=first,
                    token_ids=tokens[first : s + rows + 1],
                    hidden_start_pos=s,
                    hidden=chunk.hidden,
                )
                chunks.append(draft_pb2.IngestChunk(update=update))
        except grpc.aio.AioRpcError as err:
            log.warning("hidden rows of %s unread (%s): its Ingest waits for a later step",
                        rid, err.code().name)  # fmt: skip
            return None
        return chunks

    async def _send(
        self,
        req: Request,
        replica: DraftReplica,
        chunks: list[draft_pb2.IngestChunk],
        last: int,
        retractions: int,
    ) -> None:
        units = last + 1
        # Per token, but never below a round's: a short context still costs a round trip.
        health = replica.health
        deadline = max(health.deadline_s("propose"), health.deadline_s("ingest", units))
        started = time.perf_counter()
        try:
            with telemetry.draft_timer(replica.address, "Ingest"):
                reply = await replica.stub.Ingest(iter(chunks), timeout=deadline)
        except grpc.aio.AioRpcError as err:
            self._failed(req, replica, err, deadline, time.perf_counter() - started)
            return
        except asyncio.CancelledError:
            if cancelling_this_task():
                raise
            # gRPC's own race: a stream-unary call whose deadline passes while its request
            # iterator writes can end as a cancelled task instead of DEADLINE_EXCEEDED (about 1
            # in 11 such calls on loopback). Raised on, it ended the scheduler's loop and the
            # router (CI, 2026-12-04, an abort storm). The call is over: a missed deadline.
            req.draft_end = -1
            self.pool.missed(replica, f"Ingest ({deadline * 1e3:.0f} ms, ended cancelled)")
            return
        seconds = time.perf_counter() - started
        replica.health.record("ingest", seconds, units)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("ingested %s: %d tokens in %.2f ms, the replica's own work %.2f ms",
                      req.request_id, units, seconds * 1e3, reply.compute_ms)  # fmt: skip
        if req.num_retractions != retractions:
            return  # retracted meanwhile: it is ingested whole again after its recompute
        req.pending_update, req.draft_end = None, last
        # Steps that ran meanwhile were target-only: their tokens come as an update.
        req.draft_synced = req.num_computed == last

    def _failed(
        self,
        req: Request,
        replica: DraftReplica,
        err: grpc.aio.AioRpcError,
        deadline: float,
        elapsed: float,
    ) -> None:
        req.draft_end = -1  # whatever the replica holds now is not known
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.pool.missed(replica, f"Ingest ({deadline * 1e3:.0f} ms)")
        elif err.code() in DEADLINE_RACE_CODES and elapsed >= deadline:
            # gRPC's race again: a deadline passing while the request iterator writes can end
            # the call INTERNAL ("Failed execute_batch" of a send) or CANCELLED instead. Taken
            # as a loss, it dropped a healthy replica (CI, 2026-12-07). A call that ran its
            # whole deadline missed it, whatever its status says.
            self.pool.missed(replica, f"Ingest ({deadline * 1e3:.0f} ms, ended {err.code().name})")
        elif err.code() == grpc.StatusCode.INVALID_ARGUMENT:
            log.error("replica %s refused the context of %s: %s", replica.address,
                      req.request_id, err.details())  # fmt: skip
            self.pool.unassign(replica, req.request_id)
            req.replica = None
        else:
            self.lose_replica(replica, f"Ingest: {err.code().name}")


DEADLINE_RACE_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)


def cancelling_this_task() -> bool:
    """Whether the running task itself is being cancelled (a stop, a gather's cancel), not only
    a call it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
