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

import grpc

from protos import draft_pb2, target_pb2
from router import telemetry
from router.catch_up import CatchUp
from router.draft_pool import DraftPool, DraftReplica
from router.forced_steps import ForcedSteps
from router.kv_manager import KVManager
from router.request import Request
from router.skipped_rounds import merge_updates, skipped_trees
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
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
        forced_steps: ForcedSteps | None = None,
    ) -> None:
        self.pool = pool
        self.catching_up = CatchUp(pool, target, max_catch_up_per_step, self._lose_replica)
        self.ingests = self.catching_up.ingests  # whole-context Ingests out (router/ingests.py)
        self.target = target
        self.kv = kv
        self.default_on = default_on
        self.max_tree_tokens = max_tree_tokens
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.max_verify_tokens = max_verify_tokens  # the target's max_batch_tokens
        self.last_draft_compute_ms = 0.0  # the slowest replica's own work in the last propose
        self.last_draft_device_ms = 0.0  # that replica's device time (0: a CPU drafter)
        # Target-only chains of forced tokens (router/forced_steps.py), as the target allows.
        self.forced_steps = forced_steps or ForcedSteps(eager_is_fine=True, graph_batch=0)

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
            and not self.ingests.busy(req)
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
        updates = [self._update(r) for r in reqs]
        items = [
            draft_pb2.ProposeItem(update=u, round=r.round)
            for r, u in zip(reqs, updates, strict=True)
        ]
        request = draft_pb2.ProposeRequest(items=items)
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
                    req.draft_synced, req.pending_update, req.draft_end = False, None, -1
            else:
                self._lose_replica(replica, f"Propose: {err.code().name}")
            return []
        replica.health.record("propose", time.perf_counter() - started)
        if reply.compute_ms >= self.last_draft_compute_ms:  # the slowest replica's figures
            self.last_draft_compute_ms = reply.compute_ms
            self.last_draft_device_ms = reply.device_ms
        return self._taken(reqs, updates, reply)

    def _taken(
        self,
        reqs: list[Request],
        updates: list[draft_pb2.ContextUpdate],
        reply: draft_pb2.ProposeResponse,
    ) -> list[draft_pb2.DraftTree]:
        """The reply's trees; each request whose drafter took its update now holds its context
        up to that update's root (``draft_end``, router/catch_up.py)."""
        trees = []
        for req, update, tree in zip(reqs, updates, reply.trees, strict=False):
            req.pending_update = None
            if tree.needs_context or tree.request_id != req.request_id:
                req.draft_synced, req.draft_end = False, -1
                continue
            req.draft_end = update.start_pos + len(update.token_ids) - 1
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

    def tree_limit(self, req: Request, num_nodes: int, share: int) -> int:
        """Most nodes ``req``'s verified tree has this step, from a tree of ``num_nodes``: a
        constrained request's may grow by its format's forced tokens (router/grammar_tree.py)
        to the tree limit, or to its last token. Its slots are reserved for that many
        (router/retraction.py)."""
        size = min(num_nodes, self.max_tree_tokens)
        if req.constraint is not None and req.forced_drafts:
            # Not past the request's last token: a target-only request's slots end there.
            remaining = req.options.max_new_tokens - len(req.output_ids)
            size = max(size, min(self.max_tree_tokens, remaining))
        return max(1, min(size, self.max_context - req.num_computed, share))

    def verify_item(
        self, req: Request, tree: draft_pb2.DraftTree, max_nodes: int
    ) -> target_pb2.VerifyItem:
        """A well-formed tree rooted at the last committed token, with its slots reserved."""
        start = req.num_computed
        limit = self.tree_limit(req, len(tree.token_ids), max_nodes)
        tokens, parents = self._sanitize(req, tree, room=limit)
        masks = b""
        if req.constraint is not None:  # structured output: live nodes, each one's mask
            grow_to = limit if req.forced_drafts else 0
            tokens, parents, masks, forced = req.constraint.live_tree(tokens, parents, grow_to)
            req.forced_tokens += forced
            if forced:
                telemetry.observer().tokens_forced(forced)
        self.kv.ensure_slots(req, start + len(tokens))
        item = target_pb2.VerifyItem(
            request_id=req.request_id,
            start_pos=start,
            token_ids=tokens,
            parent_indices=parents,
            new_slots=req.slots[req.num_sent_slots :],
            return_hidden=bool(req.replica and req.replica.info and req.replica.info.needs_hidden),
            allowed_tokens=masks,
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

    def after_forced(self, req: Request, result: target_pb2.VerifyResult, num_nodes: int) -> None:
        """A target-only step's Verify of the tokens the format forced (router/forced_steps.py):
        counted as a round, and, like any target-only step, it leaves the drafter behind."""
        req.verify_steps += 1
        req.draft_tokens += num_nodes - 1
        req.accepted_tokens += result.num_accepted
        req.draft_synced = False

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

    # ---- catching a replica up: router/catch_up.py -------------------------------------

    async def catch_up(self, reqs: list[Request]) -> None:
        await self.catching_up.run(reqs)
