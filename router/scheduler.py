"""Continuous batching: requests join and leave the running batch at every step.

One asyncio task runs the loop ``admit -> schedule -> forward -> commit``. Every mutation of
request state happens on that task, between awaits, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from protos import draft_pb2
from router import telemetry
from router.commit import Commit
from router.config import RouterConfig
from router.draft_ahead import DraftAhead
from router.errors import DuplicateRequest, Overloaded, ServiceFailure
from router.intake import ArrivalGate
from router.kv_manager import KVManager
from router.multi_step import MultiStep, decode_item
from router.request import Request
from router.retraction import KVPressure
from router.speculation import Speculation
from router.stats import ServerCounters
from router.step_mode import StepMode
from router.step_timing import StepClock
from router.target_calls import TargetReplies, forward_and_verify
from router.target_client import TargetClient
from router.target_releases import TargetReleases
from router.tokenizer import Tokenizer

log = logging.getLogger("splitspec.router")


@dataclass
class Planned:
    """One request's share of a step."""

    req: Request
    num_tokens: int
    sample: bool
    prefill: bool = False


class Scheduler:
    def __init__(
        self,
        config: RouterConfig,
        tokenizer: Tokenizer,
        target: TargetClient,
        kv: KVManager,
        spec: Speculation,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.target = target
        self.kv = kv
        self.spec = spec
        self.counters = ServerCounters()
        self.multi_step = MultiStep(config.decode_steps, config.grammar_bursts)
        # a step's blocks into the streams (a burst cut where its format refuses a token)
        self.commit = Commit(tokenizer, self.counters, self.multi_step.bursts)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.in_flight: dict[str, Request] = {}
        self._wakeup = asyncio.Event()
        self.intake = ArrivalGate()  # a burst of calls is taken in before the next step
        self.releases = TargetReleases(target, self.in_flight)  # a failed one goes again
        self.before_step: list[Callable[[], Awaitable[None]]] = [
            self.intake.settle,
            self._flush_releases,
        ]
        self.target_unavailable: str | None = None  # set: new requests refused UNAVAILABLE
        self.pressure = KVPressure(self)  # --kv-policy retract: what gives way when slots run short
        self.mode = StepMode(config, spec)  # speculate or not, and what a step measured
        self.draft_ahead = DraftAhead(spec)

    # ---- called by the servicer ---------------------------------------------------------

    def check_queue(self) -> None:
        if self.target_unavailable:
            raise ServiceFailure(self.target_unavailable)
        if len(self.waiting) >= self.config.max_queue:
            raise Overloaded(
                f"admission queue is full ({self.config.max_queue} waiting); retry later"
            )

    def submit(self, req: Request) -> None:
        if req.request_id in self.in_flight:
            raise DuplicateRequest(f"request id {req.request_id!r} is already in flight")
        self.check_queue()
        self.in_flight[req.request_id] = req
        self.commit.open(req)
        self.waiting.append(req)
        self._wakeup.set()
        telemetry.observer().request_admitted(req)

    def abort(self, request_id: str) -> bool:
        req = self.in_flight.get(request_id)
        if req is None:
            return False
        req.abort_requested = True
        self._wakeup.set()
        return True

    # ---- the loop -------------------------------------------------------------------------

    def wake(self) -> None:
        self._wakeup.set()

    def replace_kv(self, kv: KVManager) -> None:
        self.kv = self.spec.kv = kv

    async def fail_all(self, message: str) -> None:
        await self._fail_requests([*self.running, *self.waiting], message)

    async def run(self) -> None:
        while True:
            for hook in self.before_step:
                await hook()
            await self._drop_aborted()
            self._admit()
            if not self.running:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self.step()

    async def step(self) -> None:
        started = time.perf_counter()
        plan = self._schedule()
        speculate = self.mode.choose(self.running, any(p.prefill and p.sample for p in plan))
        # Catching drafters up belongs to the step it readies: its time is the mode's cost (the
        # switch's). The step timings' clock starts after it: an Ingest moves a request's whole
        # context once, after its prefill or a target-only spell, and says nothing of a round.
        caught_up = speculate and await self._catch_up()
        clock = StepClock()
        emitted = sum(len(p.req.output_ids) for p in plan)
        # A target-only step right after a speculative one still waits for the Propose that
        # step sent ahead: the mode change's cost, like a catch-up, not target-only's rate.
        switched_off = not speculate and self.draft_ahead.out
        trees = await self._trees(plan, speculate, clock)
        forced = self.spec.forced_steps.trees(plan, trees)  # router/forced_steps.py
        plan, trees = await self.pressure.relieve(plan, trees | forced)
        drafted = any(request_id not in forced for request_id in trees)
        plain = [p for p in plan if p.req.request_id not in trees]
        verify = [(p.req, trees[p.req.request_id]) for p in plan if p.req.request_id in trees]
        steps = self.multi_step.steps_for(self, plan, trees)  # K decode steps: router/multi_step.py
        replies = await self._call_target(plan, plain, verify, steps, clock)
        if replies is None:
            return
        done = await self._commit_replies(plain, verify, steps, replies, forced)
        await self._finish(done)
        # An Ingest out shares the machine with the step (router/ingests.py).
        clean = not (caught_up or switched_off or self.spec.ingests.in_flight)
        self.mode.measure(plan, self.running, drafted, clock, emitted, clean, started)

    async def _trees(
        self, plan: list[Planned], speculate: bool, clock: StepClock
    ) -> dict[str, draft_pb2.DraftTree]:
        """The step's draft trees (the Propose sent ahead last step, or one sent now)."""
        with clock.span("draft"):
            ready = [p.req for p in plan if not p.prefill]
            trees = await self.draft_ahead.trees(ready, speculate)
        if trees:  # read now: the next round's Propose may leave before this step ends
            clock.draft_compute_ms = self.spec.last_draft_compute_ms
            clock.draft_device_ms = self.spec.last_draft_device_ms
        return trees

    async def _commit_replies(
        self,
        plain: list[Planned],
        verify: list[tuple[Request, draft_pb2.DraftTree]],
        steps: int,
        replies: TargetReplies,
        forced: dict[str, draft_pb2.DraftTree],
    ) -> list[Request]:
        """Sends the next round's Propose ahead (before the commit: it is the round's critical
        path), then commits both replies; returns the requests that finished."""
        forward_reply, verify_reply = replies.forward, replies.verify
        results = list(verify_reply.results) if verify_reply is not None else []
        if verify_reply is not None:
            await self.draft_ahead.after_verify(verify, replies.verify_items, results, forced)
        done = self.commit.plain(plain, forward_reply, steps)
        return done + self.commit.verified(verify, replies.verify_items, results)

    async def _catch_up(self) -> bool:
        """Catches drafters that fell behind up, or begins their Ingest (router/ingests.py),
        after the Ingests begun a step ago ended; returns whether there was any of it.

        The Ingest runs beside the step only where a target-only step decodes several tokens
        (multi-step, as on a GPU), so that the request's step is worth the Ingest's time and
        the other requests do not wait for it. With one token a step it gained nothing: on
        the 2-core CPU box batch-1 EAGLE ran 35.2-36.0 tok/s with the Ingest beside a step,
        33.8-36.9 waiting for it (2026-12-05), so there it is waited for, in this step, as
        before."""
        waited = await self.spec.ingests.settle_all()
        behind = [r for r in self.running if self.spec.needs_sync(r)]
        if behind:
            await self.spec.catch_up(behind)
            if self.multi_step.max_steps == 1:
                await self.spec.ingests.settle_all()
        return waited or bool(behind)

    async def _call_target(
        self,
        plan: list[Planned],
        plain: list[Planned],
        verify: list[tuple[Request, draft_pb2.DraftTree]],
        steps: int,
        clock: StepClock,
    ) -> TargetReplies | None:
        """The step's Forward and Verify; None when the target failed (the plan failed too)."""
        forward_items = [decode_item(self.kv, p, steps) for p in plain]
        verify_items = self.spec.verify_items(verify)
        try:
            with clock.span("target"):
                forward_reply, verify_reply = await forward_and_verify(
                    self.target, forward_items, verify_items, steps
                )
        except grpc.aio.AioRpcError as err:
            await self._fail(plan, f"target failed: {err.code().name}: {err.details()}")
            return None
        telemetry.target_replies(forward_reply, verify_reply)
        clock.target_replied(forward_reply, verify_reply)
        return TargetReplies(verify_items, forward_reply, verify_reply)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running:
            if not self.kv.try_admit(self.waiting[0]):
                break  # FIFO: the head waits for slots; later requests do not overtake it
            self.running.append(self.waiting.popleft())

    def _schedule(self) -> list[Planned]:
        """Every decoding request gets one token; prefills share what is left, in order."""
        plan = [Planned(r, 1, True) for r in self.running if not r.is_prefilling]
        budget = self.config.max_step_tokens - len(plan)
        for req in self.running:
            if req.is_prefilling and budget > 0:
                n = min(req.prefill_len - req.num_computed, budget)
                plan.append(Planned(req, n, req.num_computed + n == req.prefill_len, prefill=True))
                budget -= n
        now = time.perf_counter()
        for p in plan:
            p.req.first_scheduled = p.req.first_scheduled or now
        return plan

    # ---- endings ------------------------------------------------------------------------------

    async def _drop_aborted(self) -> None:
        aborted = [r for r in self.in_flight.values() if r.abort_requested and not r.finished]
        for req in aborted:
            self.commit.aborted(req)
        await self._finish(aborted)

    async def _finish(self, reqs: list[Request], cache: bool = True) -> None:
        if not reqs:
            return
        for req in reqs:
            req.finished = True
            self.kv.finish(req, cache=cache)
            self.in_flight.pop(req.request_id, None)
            self.commit.close(req)
        gone = {id(r) for r in reqs}
        self.running = [r for r in self.running if id(r) not in gone]
        self.waiting = deque(r for r in self.waiting if id(r) not in gone)
        started = [r.request_id for r in reqs if r.num_sent_slots]
        await self.spec.ingests.settle(reqs)  # no drafter takes a context after its Release
        # The target's and the drafters' releases together: one round trip, not two in a row.
        await asyncio.gather(
            self.releases.release(started),
            *(self.spec.pool.release(r.replica, r.request_id) for r in reqs),
        )

    async def _flush_releases(self) -> None:
        if self.target_unavailable is None:  # a lost target is swept whole once it is back
            await self.releases.flush()

    async def _fail(self, plan: list[Planned], message: str) -> None:
        log.error("%s; failing %d requests", message, len(plan))
        await self._fail_requests([p.req for p in plan], message)

    async def _fail_requests(self, reqs: list[Request], message: str) -> None:
        now = time.perf_counter()
        for req in reqs:
            req.outbox.put_nowait(ServiceFailure(message))
            telemetry.observer().request_failed(req, message, now)
            self.counters.record_failed(req)
        # KV written by a failed step is not trusted: nothing of these requests is cached.
        await self._finish(reqs, cache=False)
