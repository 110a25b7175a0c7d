"""KV pressure under ``--kv-policy retract``: what gives way when a step cannot get its slots.

Admission there reserves a request's prefill, not its whole generation (router/kv_manager.py),
so the running requests can together outgrow the pool. Before every step the scheduler asks
for the slots the step will allocate; while they exceed what is free or evictable:

1. **Draft trees give way first**, the newest request's first: such a request decodes one
   token this step instead of verifying a tree (one slot instead of a tree's worth).
2. **Tree tails are freed**: slots a request holds past its next position (left by verified
   trees) go back to the pool, newest request first. The target's table of such a request is
   rebuilt: it is released there and the next step re-sends every slot.
3. **Requests are retracted**, the most recently admitted first (so the oldest always
   progresses and nothing starves): its computed KV goes into the radix cache (evictable,
   kept while nothing needs the room), its other slots are freed, its state on the target is
   released, and it goes back to the front of the queue. It keeps everything it streamed: on
   re-admission it prefills prompt + generated tokens (most of it found in the cache when it
   survived) and the last chunk samples the next token, exactly as a decode step would
   (sampling is keyed by seed and position, see model_runtime/sampling.py), so the client sees
   the stream continue with no token repeated or lost.

Requests with presence or frequency penalties are never retracted (the target's completion
counts would not survive); they hold their whole reservation instead. repetition_penalty and
min_tokens survive: re-opened, the target gets the whole context as the repetition context and
the tokens min_tokens still owes (router/forward_item.py). A request is
re-admitted only while every running request still has a block of room to grow, so a
retraction is not undone at once. Retractions are counted in GetServerStatus
(``num_retractions``) and /metrics (``splitspec:num_preemptions_total``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from protos import draft_pb2
from router.request import Request

if TYPE_CHECKING:
    from router.scheduler import Planned, Scheduler

log = logging.getLogger("splitspec.router")
Trees = dict[str, draft_pb2.DraftTree]


class KVPressure:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def relieve(self, plan: list[Planned], trees: Trees) -> tuple[list[Planned], Trees]:
        """The step's plan and trees, cut down until their slots can be had."""
        kv = self.scheduler.kv
        if not kv.retract or self._shortfall(plan, trees) <= 0:
            return plan, trees
        trees, dropped = dict(trees), 0
        for p in reversed(plan):
            if self._shortfall(plan, trees) <= 0:
                break
            dropped += trees.pop(p.req.request_id, None) is not None
        rebuilt: list[Request] = []
        for p in reversed(plan):
            if self._shortfall(plan, trees) <= 0:
                break
            if p.req.request_id not in trees and self._trim(p):
                p.req.num_sent_slots = 0  # the next item carries the whole table again
                rebuilt.append(p.req)
        victims: list[Request] = []
        while self._shortfall(plan, trees) > 0 and (victim := self._newest_retractable()):
            self._retract(victim)
            victims.append(victim)
            trees.pop(victim.request_id, None)
            plan = [p for p in plan if p.req is not victim]
        # Tree drops alone can happen every step under pressure: not worth a line each.
        log.log(
            logging.INFO if rebuilt or victims else logging.DEBUG,
            "KV pressure: %d trees dropped, %d tables rebuilt, %d requests retracted",
            dropped, len(rebuilt), len(victims),
        )  # fmt: skip
        await self._release(list({id(r): r for r in [*rebuilt, *victims]}.values()))
        return plan, trees

    def _positions(self, p: Planned, tree: draft_pb2.DraftTree | None, share: int) -> int:
        """Context positions the request's slots must cover in this step (see verify_item)."""
        start = p.req.num_computed
        if tree is None:
            return start + p.num_tokens
        return start + self.scheduler.spec.tree_limit(p.req, len(tree.token_ids), share)

    def _shortfall(self, plan: list[Planned], trees: Trees) -> int:
        kv, spec = self.scheduler.kv, self.scheduler.spec
        num_trees = sum(p.req.request_id in trees for p in plan)
        share = max(1, spec.max_verify_tokens // max(1, num_trees))
        need = sum(
            kv.extra_needed(p.req, self._positions(p, trees.get(p.req.request_id), share))
            for p in plan
        )
        return need - kv.available

    def _trim(self, p: Planned) -> bool:
        return self.scheduler.kv.trim(p.req, p.req.num_computed + p.num_tokens) > 0

    def _newest_retractable(self) -> Request | None:
        return next((r for r in reversed(self.scheduler.running) if not r.reserved), None)

    def _retract(self, req: Request) -> None:
        s = self.scheduler
        s.kv.finish(req, cache=True)  # computed KV into the cache; the rest freed
        req.recompute_len = len(req.context_ids)
        req.num_computed = req.num_sent_slots = 0
        # Re-ingested whole after the recompute.
        req.draft_synced, req.pending_update, req.draft_end = False, None, -1
        req.num_retractions += 1
        s.counters.num_retractions += 1
        s.running.remove(req)
        s.waiting.appendleft(req)  # older than anything waiting: first to come back

    async def _release(self, reqs: list[Request]) -> None:
        await self.scheduler.releases.release([r.request_id for r in reqs])
