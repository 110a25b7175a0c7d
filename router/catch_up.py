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
  MAX_UPDATE_ROWS, or one whose replica refused an update. The call runs while the request
  decodes one target-only step (router/ingests.py). At most ``max_per_step`` a step: when a
  replica is ejected its requests move to the others over a few steps instead of one step
  re-ingesting all of them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

import grpc

from protos import draft_pb2
from router.draft_pool import DraftPool, DraftReplica
from router.ingests import Ingests
from router.request import Request
from router.skipped_rounds import concat_rows
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
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
        self.target = target
        self.max_per_step = max_per_step
        self.ingests = Ingests(pool, target, lose_replica)

    async def run(self, reqs: list[Request]) -> None:
        """Requests whose drafter can take an update get one, up to MAX_STEP_UPDATE_ROWS rows
        in all (the rest in later steps); up to ``max_per_step`` others are sent off to be
        ingested whole (router/ingests.py)."""
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
            *(self._update(r) for r in by_update), *(self.ingests.begin(r) for r in rest)
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
