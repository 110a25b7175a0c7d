"""The speculative round: propose on the request's draft replica, verify on the target.

A round costs one Propose (carrying what the last verify committed) and one Verify. Drafter
trouble of any kind (a lost replica, a context it does not hold, a malformed tree) turns into a
target-only step for that request, never a failure: output stays the target's.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import AsyncIterator

import grpc

from protos import draft_pb2, target_pb2
from router import telemetry
from router.draft_pool import DraftPool, DraftReplica
from router.kv_manager import KVManager
from router.request import Request
from router.skipped_rounds import merge_updates, skipped_trees
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
INGEST_TOKENS_PER_CHUNK = 1024
MAX_CATCH_UP_PER_STEP = 4
PROPOSE_ATTEMPTS = 2
PROPOSE_RETRY_WAIT_S = 0.05


def _transient(err: BaseException) -> bool:
    # Only a refused connection is retried: a replica that ran out its deadline once would
    # only stall the whole step again.
    return isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.UNAVAILABLE


async def _propose_call(
    replica: DraftReplica, request: draft_pb2.ProposeRequest, deadline_s: float
) -> draft_pb2.ProposeResponse:
    """Propose is idempotent per (request_id, round): a retry never appends twice. A plain
    loop, not tenacity's: its retrying machinery cost ~65 us a call on the 2-core dev box."""
    for _ in range(PROPOSE_ATTEMPTS - 1):
        try:
            return await _timed_propose(replica, request, deadline_s)
        except grpc.aio.AioRpcError as err:
            if not _transient(err):
                raise
        await asyncio.sleep(PROPOSE_RETRY_WAIT_S)
    return await _timed_propose(replica, request, deadline_s)


async def _timed_propose(
    replica: DraftReplica, request: draft_pb2.ProposeRequest, deadline_s: float
) -> draft_pb2.ProposeResponse:
    with telemetry.draft_timer(replica.address, "Propose"):
        return await replica.propose(request, timeout=deadline_s)


class Speculation:
    def __init__(
        self,
        pool: DraftPool,
        target: TargetClient,
        kv: KVManager,
        *,
        default_on: bool,
        max_tree_tokens: int,
        vocab_size: int,
        max_context: int,
        max_verify_tokens: int,
        max_catch_up_per_step: int = MAX_CATCH_UP_PER_STEP,
    ) -> None:
        self.pool = pool
        self.max_catch_up_per_step = max_catch_up_per_step
        self.target = target
        self.kv = kv
        self.default_on = default_on
        self.max_tree_tokens = max_tree_tokens
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.max_verify_tokens = max_verify_tokens  # the target's max_batch_tokens
        self.last_draft_compute_ms = 0.0  # the slowest replica's own work in the last propose
        self.last_draft_device_ms = 0.0  # that replica's device time (0: a CPU drafter)

    def wanted(self, req: Request) -> bool:
        return bool(self.pool.replicas) and (
            self.default_on if req.speculate is None else req.speculate
        )

    def ready(self, req: Request) -> bool:
        return req.draft_synced and req.replica is not None and req.replica.healthy

    def needs_sync(self, req: Request) -> bool:
        return (
            not req.finished
            and not req.is_prefilling
            and not req.draft_synced
            and self.wanted(req)
            and any(r.usable for r in self.pool.replicas)
        )

    # ---- proposing ------------------------------------------------------------------------

    async def propose(self, reqs: list[Request]) -> dict[str, draft_pb2.DraftTree]:
        """Trees for the requests whose replica answered; the others go target-only."""
        groups: dict[DraftReplica, list[Request]] = {}
        for req in reqs:
            groups.setdefault(req.replica, []).append(req)
        self.last_draft_compute_ms = self.last_draft_device_ms = 0.0
        if len(groups) == 1:
            # One replica: awaited as it is. A gather's task would leave the request unwritten
            # for a turn of the loop, behind whatever else is ready (a client's stream write).
            ((replica, group),) = groups.items()
            answers = [await self._propose_on(replica, group)]
        else:
            answers = await asyncio.gather(*(self._propose_on(r, g) for r, g in groups.items()))
        return {t.request_id: t for trees in answers for t in trees}

    async def _propose_on(
        self, replica: DraftReplica, reqs: list[Request]
    ) -> list[draft_pb2.DraftTree]:
        if not replica.health.callable:
            return skipped_trees(reqs)  # suspected: not waited for; updates kept for later
        request = draft_pb2.ProposeRequest(
            items=[draft_pb2.ProposeItem(update=self._update(r), round=r.round) for r in reqs]
        )
        deadline = replica.health.deadline_s("propose")
        started = time.perf_counter()
        try:
            reply = await _propose_call(replica, request, deadline)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.pool.missed(replica, f"Propose ({deadline * 1e3:.0f} ms)")
                return skipped_trees(reqs)
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # Our message was wrong, not the replica: resend whole contexts next time.
                log.error("replica %s refused a Propose: %s", replica.address, err.details())
                for req in reqs:
                    req.draft_synced, req.pending_update = False, None
            else:
                self._lose_replica(replica, f"Propose: {err.code().name}")
            return []
        replica.health.record("propose", time.perf_counter() - started)
        if reply.compute_ms >= self.last_draft_compute_ms:  # the slowest replica's figures
            self.last_draft_compute_ms = reply.compute_ms
            self.last_draft_device_ms = reply.device_ms
        trees = []
        for req, tree in zip(reqs, reply.trees, strict=False):
            req.pending_update = None
            if tree.needs_context or tree.request_id != req.request_id:
                req.draft_synced = False
            else:
                trees.append(tree)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("tree for %s round %d: %d nodes, first %s", req.request_id,
                              req.round, len(tree.token_ids), list(tree.token_ids[:6]))  # fmt: skip
        return trees

    def _update(self, req: Request) -> draft_pb2.ContextUpdate:
        if req.pending_update is not None:
            return req.pending_update
        return draft_pb2.ContextUpdate(
            request_id=req.request_id,
            start_pos=req.num_computed + 1,
            hidden_start_pos=req.num_computed,
        )

    def _lose_replica(self, replica: DraftReplica, reason: str) -> None:
        telemetry.observer().draft_failure(replica.address, reason)
        self.pool.mark_failed(replica, reason)

    # ---- verifying ------------------------------------------------------------------------

    def verify_items(
        self, verify: list[tuple[Request, draft_pb2.DraftTree]]
    ) -> list[target_pb2.VerifyItem]:
        """One Verify's items; trees are cut so that together they fit the target's batch."""
        share = max(1, self.max_verify_tokens // max(1, len(verify)))
        return [self.verify_item(req, tree, share) for req, tree in verify]

    def verify_item(
        self, req: Request, tree: draft_pb2.DraftTree, max_nodes: int
    ) -> target_pb2.VerifyItem:
        """A well-formed tree rooted at the last committed token, with its slots reserved."""
        start = req.num_computed
        room = min(self.max_context - start, max_nodes)
        tokens, parents = self._sanitize(req, tree, room=room)
        self.kv.ensure_slots(req, start + len(tokens))
        item = target_pb2.VerifyItem(
            request_id=req.request_id,
            start_pos=start,
            token_ids=tokens,
            parent_indices=parents,
            new_slots=req.slots[req.num_sent_slots :],
            return_hidden=bool(req.replica.info and req.replica.info.needs_hidden),
        )
        req.num_sent_slots = len(req.slots)
        return item

    def _sanitize(
        self, req: Request, tree: draft_pb2.DraftTree, room: int
    ) -> tuple[list[int], list[int]]:
        size = max(1, min(len(tree.token_ids), self.max_tree_tokens, room))
        tokens, parents = list(tree.token_ids[:size]), list(tree.parent_indices[:size])
        # Whole-list builtins, not a Python loop over the nodes (64 on the GPU's default tree).
        ok = (
            len(tokens) == len(parents) == size
            and parents[0] == -1
            and (size == 1 or min(parents[1:]) >= 0)
            and all(map(operator.lt, parents[1:], range(1, size)))  # a parent comes first
            and min(tokens) >= 0
            and max(tokens) < self.vocab_size
        )
        if not ok:
            log.warning("malformed tree for %s dropped", req.request_id)
            tokens, parents = [0], [-1]
        tokens[0] = req.output_ids[-1]  # the root is ours to state, whatever the drafter said
        return tokens, parents

    def after_verify(self, req: Request, result: target_pb2.VerifyResult, num_nodes: int) -> None:
        if log.isEnabledFor(logging.DEBUG):  # --log-level debug; else nothing per round
            log.debug("round %d of %s at position %d: %d of %d drafts accepted: %s",
                      req.round, req.request_id, req.num_computed, result.num_accepted,
                      num_nodes - 1, list(result.token_ids))  # fmt: skip
        req.verify_steps += 1
        req.draft_tokens += num_nodes - 1
        req.accepted_tokens += result.num_accepted
        req.round += 1
        start = req.num_computed  # before the commit: the root's position
        update = draft_pb2.ContextUpdate(
            request_id=req.request_id,
            start_pos=start + 1,
            token_ids=result.token_ids,
            hidden_start_pos=start,
        )
        if result.HasField("hidden"):
            update.hidden.CopyFrom(result.hidden)
        # A replica that was skipped has not taken the previous update yet: it gets both.
        old = req.pending_update
        req.pending_update = update if old is None else merge_updates(old, update)

    # ---- catching a replica up -------------------------------------------------------------

    async def catch_up(self, reqs: list[Request]) -> None:
        # A bounded number per step: when a replica is ejected, its requests move to the others
        # over a few steps instead of one step re-ingesting all of them (the others wait).
        await asyncio.gather(*(self._sync(r) for r in reqs[: self.max_catch_up_per_step]))

    async def _sync(self, req: Request) -> None:
        if req.replica is not None and not req.replica.usable:
            self.pool.move_away(req.replica, req.request_id)
            req.replica = None
        if req.replica is None:
            req.replica = self.pool.assign(req.request_id)
        replica = req.replica
        if replica is None:
            return
        units = req.num_computed + 1
        # Per token, but never below a round's: a short context still costs a round trip.
        health = replica.health
        deadline = max(health.deadline_s("propose"), health.deadline_s("ingest", units))
        started = time.perf_counter()
        try:
            with telemetry.draft_timer(replica.address, "Ingest"):
                await replica.stub.Ingest(self._ingest_chunks(req, replica), timeout=deadline)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.pool.missed(replica, f"Ingest ({deadline * 1e3:.0f} ms)")
                return
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                log.error(
                    "replica %s refused the context of %s: %s",
                    replica.address,
                    req.request_id,
                    err.details(),
                )
                self.pool.unassign(replica, req.request_id)
                req.replica = None
                return
            self._lose_replica(replica, f"Ingest: {err.code().name}")
            return
        replica.health.record("ingest", time.perf_counter() - started, units)
        req.draft_synced, req.pending_update = True, None

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
                yield draft_pb2.IngestChunk(
                    update=draft_pb2.ContextUpdate(
                        request_id=rid,
                        start_pos=s,
                        token_ids=tokens[s : s + INGEST_TOKENS_PER_CHUNK],
                    )
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
