"""Catching a drafter up with a request whose target-only steps it missed.

A request that leaves speculation for a while (the switch's target-only spell, a batch past
--max-speculative-batch) has its drafter stop at the last update it took: ``draft_end``, the
position of that update's root. When it speculates again there are two ways back:

* by update: the drafter still holds the request, so it gets only what it missed, tokens
  draft_end + 1 .. L and (EAGLE) the target's hidden rows draft_end .. L - 1 from its pool, as the
  next Propose's update. One ReadHidden call, no Ingest; on the H200 a probe's catch-up took
  ~25 ms as a whole-context Ingest. A drafter that no longer lines up answers needs_context and
  the request is ingested whole the step after.
* by Ingest: the whole context, streamed in chunks, replacing what the replica held: a request
  new to its replica (a prefill, a replica lost or ejected), one behind by more than
  MAX_UPDATE_ROWS, or one whose replica refused an update. At most ``max_per_step`` a step:
  when a replica is ejected its requests move to the others over a few steps instead of one
  step re-ingesting all of them while the others wait.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from protos import draft_pb2
from router import telemetry
from router.draft_pool import DraftPool, DraftReplica
from router.request import Request
from router.skipped_rounds import concat_rows
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
INGEST_TOKENS_PER_CHUNK = 1024
# A longer miss is ingested (streamed) rather than carried in one Propose: 256 rows of the
# default model are 288 KiB, and a Propose carries every request of its batch.
MAX_UPDATE_ROWS = 256
# And the updates of one step together stay well inside a message's 64 MiB: 4096 rows of an
# 8B model (hidden 4096) in bf16 are 32 MiB.
MAX_STEP_UPDATE_ROWS = 4096


class CatchUp:
    def __init__(
        self,
        pool: DraftPool,
        target: TargetClient,
        max_per_step: int,
        lose_replica: Callable[[DraftReplica, str], None],
    ) -> None:
        self.pool = pool
        self.target = target
        self.max_per_step = max_per_step
        self.lose_replica = lose_replica

    async def run(self, reqs: list[Request]) -> None:
        """Requests whose drafter can take an update get one, up to MAX_STEP_UPDATE_ROWS rows
        in all (the rest in later steps); up to ``max_per_step`` others are ingested whole."""
        updatable: list[Request] = []
        rest: list[Request] = []
        for req in reqs:
            (updatable if self._can_update(req) else rest).append(req)
        rest = rest[: self.max_per_step]
        by_update: list[Request] = []
        rows = 0
        for req in updatable:
            rows += req.num_computed - req.draft_end
            if by_update and rows > MAX_STEP_UPDATE_ROWS:
                break
            by_update.append(req)
        await asyncio.gather(
            *(self._update(r) for r in by_update), *(self._ingest(r) for r in rest)
        )

    @staticmethod
    def _can_update(req: Request) -> bool:
        replica = req.replica
        missed = req.num_computed - req.draft_end
        usable = replica is not None and replica.usable
        return usable and req.draft_end >= 0 and 0 <= missed <= MAX_UPDATE_ROWS

    async def _update(self, req: Request) -> None:
        """What the drafter missed, as the next Propose's update (a round of its own)."""
        start, end = req.draft_end, req.num_computed
        update = draft_pb2.ContextUpdate(
            request_id=req.request_id,
            start_pos=start + 1,
            token_ids=req.context_ids[start + 1 : end + 1],
            hidden_start_pos=start,
        )
        info = req.replica.info
        if info and info.needs_hidden and end > start:
            try:
                read = self.target.read_hidden(req.request_id, start, end)
                chunks = [chunk.hidden async for chunk in read]
            except grpc.aio.AioRpcError as err:
                log.warning("hidden rows of %s unread (%s): ingesting it whole", req.request_id,
                            err.code().name)  # fmt: skip
                req.draft_end = -1
                return
            update.hidden.CopyFrom(functools.reduce(concat_rows, chunks))
        # Replaces any update not yet delivered: this one covers it, from the target's pool.
        req.pending_update, req.draft_synced = update, True
        req.round += 1  # a new key: the drafter may hold the last round's update already

    async def _ingest(self, req: Request) -> None:
        replica = self._placed(req)
        if replica is None:
            return
        units = req.num_computed + 1
        # Per token, but never below a round's: a short context still costs a round trip.
        health = replica.health
        deadline = max(health.deadline_s("propose"), health.deadline_s("ingest", units))
        started = time.perf_counter()
        try:
            with telemetry.draft_timer(replica.address, "Ingest"):
                reply = await replica.stub.Ingest(
                    self._ingest_chunks(req, replica), timeout=deadline
                )
        except grpc.aio.AioRpcError as err:
            self._ingest_failed(req, replica, err, deadline)
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
        req.draft_synced, req.pending_update = True, None
        req.draft_end = req.num_computed

    def _placed(self, req: Request) -> DraftReplica | None:
        """The request's replica: its own while usable, else one the pool assigns."""
        if req.replica is not None and not req.replica.usable:
            self.pool.move_away(req.replica, req.request_id)
            req.replica = None
        if req.replica is None:
            req.replica, req.draft_end = self.pool.assign(req.request_id), -1
        return req.replica

    def _ingest_failed(
        self, req: Request, replica: DraftReplica, err: grpc.aio.AioRpcError, deadline: float
    ) -> None:
        req.draft_end = -1  # whatever the replica holds now is not known
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.pool.missed(replica, f"Ingest ({deadline * 1e3:.0f} ms)")
        elif err.code() == grpc.StatusCode.INVALID_ARGUMENT:
            log.error("replica %s refused the context of %s: %s", replica.address,
                      req.request_id, err.details())  # fmt: skip
            self.pool.unassign(replica, req.request_id)
            req.replica = None
        else:
            self.lose_replica(replica, f"Ingest: {err.code().name}")

    async def _ingest_chunks(
        self, req: Request, replica: DraftReplica
    ) -> AsyncIterator[draft_pb2.IngestChunk]:
        """Tokens 0..L and, for EAGLE, hidden rows 0..L-1 from the target's pool, streamed so
        that after every chunk the replica holds one more token than hidden rows."""
        last = req.num_computed  # position of the root: its KV and hidden row do not exist yet
        tokens = req.context_ids[: last + 1]
        rid = req.request_id
        if not (replica.info and replica.info.needs_hidden):
            for s in range(0, last + 1, INGEST_TOKENS_PER_CHUNK):
                part = tokens[s : s + INGEST_TOKENS_PER_CHUNK]
                yield draft_pb2.IngestChunk(
                    update=draft_pb2.ContextUpdate(request_id=rid, start_pos=s, token_ids=part)
                )
            return
        async for chunk in self.target.read_hidden(rid, 0, last):
            s = chunk.start_pos
            rows = chunk.hidden.shape[0]
            first = 0 if s == 0 else s + 1
            yield draft_pb2.IngestChunk(
                update=draft_pb2.ContextUpdate(
                    request_id=rid,
                    start_pos=first,
                    token_ids=tokens[first : s + rows + 1],
                    hidden_start_pos=s,
                    hidden=chunk.hidden,
                )
            )


def cancelling_this_task() -> bool:
    """Whether the running task itself is being cancelled (a stop, a gather's cancel), not only
    a call it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
