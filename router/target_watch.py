"""Losing the target and getting it back, without restarting the router.

A background task checks the target's health (and the scheduler reports failed steps). When the
target is lost: the router's health turns NOT_SERVING, every in-flight request ends UNAVAILABLE
and new ones are refused UNAVAILABLE. When the target answers again, its TargetInfo is checked
against what the router was built on (router/target_contract.py): if it still fits, the KV
bookkeeping starts afresh (the radix cache is dropped: the target's KV died with it), the
router follows the new pool size and multi-step cap, and serves again; if not, it stays
NOT_SERVING and refuses requests UNAVAILABLE with the reason.
All request state changes happen on the scheduler's own task (``before_step``), never here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import target_pb2
from router.forced_steps import ForcedSteps
from router.scheduler import Scheduler
from router.target_client import TargetClient
from router.target_contract import TargetContract

log = logging.getLogger("splitspec.router")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LOST_AFTER_FAILED_CHECKS = 2


class TargetWatch:
    def __init__(
        self,
        scheduler: Scheduler,
        target: TargetClient,
        health,  # grpc_health.v1.health.aio.HealthServicer of the public server
        service_names: Iterable[str],
        contract: TargetContract,
        interval_s: float = 0.25,
    ) -> None:
        self.scheduler, self.target, self.health = scheduler, target, health
        self.names = ["", *service_names]
        self.contract, self.interval_s = contract, interval_s
        self.up = True
        self.num_losses = 0
        self._lost_reason: str | None = None  # for the scheduler's task to act on
        self._back: target_pb2.TargetInfo | None = None  # back and fit to serve
        self._refusal: str | None = None  # back but not fit: why
        scheduler.before_step.append(self._apply)

    async def run(self) -> None:
        stub = health_pb2_grpc.HealthStub(self.target.channel)
        failed_in_a_row = 0
        while True:
            await asyncio.sleep(self.interval_s)
            serving = await self._serving(stub)
            taken = await self._taken() if serving else ""
            failed_in_a_row = 0 if serving else failed_in_a_row + 1
            if self.up and taken:  # at once: the target refuses our calls already
                await self._lose(taken)
            # Two in a row: one slow answer from a busy target must not fail every request.
            elif self.up and failed_in_a_row >= LOST_AFTER_FAILED_CHECKS:
                await self._lose(f"{failed_in_a_row} health checks failed")
            elif not self.up and serving and not taken and self._back is None:
                await self._came_back()

    @staticmethod
    async def _serving(stub: health_pb2_grpc.HealthStub) -> bool:
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == SERVING

    async def _taken(self) -> str:
        """Renews this router's claim on the target (target_service/ownership.py): '' when it
        holds, else why not. Another router drives the target once this one's claim lapsed (it
        hung for the claim's lease, --target-claim-lease); this one then serves nothing until it is
        free again."""
        try:
            await self.target.claim()
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return err.details() or "another router drives the target"
        return ""  # a claim that failed otherwise: the health checks judge the target

    async def _lose(self, reason: str) -> None:
        self.up = False
        self.num_losses += 1
        # New requests are refused with the reason too: "another router drives it" wants
        # another remedy than "it does not answer".
        self.scheduler.target_unavailable = f"target {self.target.address} unavailable ({reason})"
        self._lost_reason = reason
        log.error("target lost (%s): not serving until it is back", reason)
        self.target.abort_calls(f"target lost ({reason})")
        for name in self.names:
            await self.health.set(name, NOT_SERVING)
        self.scheduler.wake()

    async def _came_back(self) -> None:
        try:
            info = await self.target.info()
        except grpc.aio.AioRpcError:
            return  # not quite back: the next check asks again
        problem = self.contract.problem(info)
        if problem is None:
            self._back, self._refusal = info, None
            self.scheduler.wake()
            return
        message = f"target {self.target.address} came back unfit: {problem}; restart the router"
        if message != self._refusal:
            log.error("%s", message)
        self._refusal = self.scheduler.target_unavailable = message

    async def _released_orphans(self) -> bool:
        """A target back without a restart still holds the requests that failed with it (their
        releases were lost): released here, where no request of ours is in flight."""
        try:
            await self.target.release_orphans("back after a loss")
        except grpc.aio.AioRpcError as err:
            log.warning("target back but its release failed (%s)", err.code().name)
            return False
        self.scheduler.releases.forget()
        return True

    async def _apply(self) -> None:
        """On the scheduler's task: end every request, or start afresh."""
        if self._lost_reason is not None:
            await self.scheduler.fail_all(self.scheduler.target_unavailable or "target lost")
            self._lost_reason = None
        if self._back is not None and not self.scheduler.in_flight:
            if not await self._released_orphans():
                self._back = None  # the next good health check tries again
                return
            # The radix cache pointed at dead KV; the pool may have another size now.
            self.scheduler.replace_kv(self.contract.adopt(self._back, self.scheduler.multi_step))
            self.scheduler.spec.forced_steps = ForcedSteps.for_target(self._back)
            self._back, self.up = None, True
            self.scheduler.target_unavailable = None
            for name in self.names:
                await self.health.set(name, SERVING)
            log.info("target is back: serving again (radix cache dropped)")
