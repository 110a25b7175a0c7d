"""Releases on the target, and those that failed sent again before the next step.

A release lost to a stall past ``--rpc-timeout`` that the health checks did not count as a loss
(or to a reset connection) left the request's row and sampling state on the target for good.
The rows ran out one by one, and then every request failed RESOURCE_EXHAUSTED ("all 4 request
rows are in use", tests/test_orphaned_requests.py). A target found lost is swept whole when it is
back (router/target_watch.py); this covers the failures in between.

An id in flight again (a retracted request back in the queue, or a client reusing the id) is
not sent: its request's first item opens it afresh on the target, which drops what the lost
release left, and a late release would drop the new request's state instead.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Container

import grpc

from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
# Not at once after a failure: the target that just failed one would most likely fail the next,
# and the step behind the retry would wait out its deadline too.
RETRY_AFTER_S = 0.5


class TargetReleases:
    def __init__(self, target: TargetClient, in_flight: Container[str]) -> None:
        self.target = target
        self.in_flight = in_flight
        self.pending: set[str] = set()  # failed: sent with the next release
        self._failed_at = -math.inf

    async def release(self, request_ids: list[str]) -> None:
        ids = [*request_ids, *self._due()]
        if not ids:
            return
        try:
            await self.target.release(ids)
        except grpc.aio.AioRpcError as err:
            self.pending.update(ids)
            self._failed_at = time.monotonic()
            log.warning("target release of %d requests failed (%s): sent again before the next "
                        "step", len(ids), err.code().name)  # fmt: skip
            return
        self.pending.difference_update(ids)

    async def flush(self) -> None:
        """The releases that failed (a hook before every step)."""
        if self.pending and time.monotonic() - self._failed_at >= RETRY_AFTER_S:
            await self.release([])

    def forget(self) -> None:
        """After a release of everything the target held."""
        self.pending.clear()

    def _due(self) -> list[str]:
        self.pending.difference_update([i for i in self.pending if i in self.in_flight])
        return sorted(self.pending)
