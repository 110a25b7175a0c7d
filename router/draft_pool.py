"""The draft replicas: assignment (a request sticks to one), failure and recovery.

A replica that fails a call is marked unhealthy and loses its requests; they continue
target-only and move to another replica after catch-up. A background probe brings a
recovered replica back (empty: requests re-ingest their context when assigned to it).
A replica that only runs past its deadline is first suspected, not ejected: see
router/replica_health.py. Releases a replica cannot take now are kept and sent once it answers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import draft_pb2, draft_pb2_grpc
from router.replica_health import CLOSED, OPEN, DeadlinePolicy, ReplicaHealth
from splitspec.grpc_util import CHANNEL_OPTIONS
from splitspec.security import ClientTLS, aio_channel

log = logging.getLogger("splitspec.router")


class _NotServing(Exception):
    pass


@dataclass(eq=False)
class DraftReplica:
    address: str
    channel: grpc.aio.Channel
    stub: draft_pb2_grpc.DraftModelStub
    info: draft_pb2.DraftInfo | None = None
    healthy: bool = False  # in rotation (not ejected); health says whether to call it now
    request_ids: set[str] = field(default_factory=set)
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    pending_releases: set[str] = field(default_factory=set)

    @property
    def usable(self) -> bool:
        return self.healthy and self.health.callable

    @classmethod
    def connect(cls, address: str, tls: ClientTLS | None = None) -> DraftReplica:
        channel = aio_channel(address, tls, CHANNEL_OPTIONS)
        return cls(address, channel, draft_pb2_grpc.DraftModelStub(channel))


class DraftPool:
    def __init__(
        self,
        addresses: list[str],
        timeout_s: float,
        probe_interval_s: float = 1.0,
        tls: ClientTLS | None = None,
    ) -> None:
        self.replicas = [DraftReplica.connect(a, tls) for a in addresses]
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        for r in self.replicas:
            r.health = ReplicaHealth(DeadlinePolicy(cap_s=timeout_s))

    @property
    def healthy(self) -> list[DraftReplica]:
        return [r for r in self.replicas if r.healthy]

    def assign(self, request_id: str) -> DraftReplica | None:
        """The least-loaded healthy replica, or None (the request runs target-only)."""
        candidates = [r for r in self.replicas if r.usable]
        if not candidates:
            return None
        replica = min(candidates, key=lambda r: len(r.request_ids))
        replica.request_ids.add(request_id)
        return replica

    def unassign(self, replica: DraftReplica | None, request_id: str) -> None:
        if replica is not None:
            replica.request_ids.discard(request_id)

    def mark_failed(self, replica: DraftReplica, reason: str) -> set[str]:
        """Takes a replica out of rotation; returns the request ids it held."""
        if replica.healthy:
            log.warning(
                "draft replica %s failed (%s); its %d requests fall back",
                replica.address,
                reason,
                len(replica.request_ids),
            )
        replica.healthy = False
        if replica.health.state != OPEN:
            replica.health.trip()
        lost, replica.request_ids = replica.request_ids, set()
        replica.pending_releases |= lost  # should it come back holding them (it hung, not died)
        return lost

    def missed(self, replica: DraftReplica, what: str) -> None:
        """A call ran past its deadline: suspected now, ejected after repeated failures."""
        log.warning("draft replica %s missed a %s deadline; skipped", replica.address, what)
        replica.health.missed()

    def move_away(self, replica: DraftReplica, request_id: str) -> None:
        """A request leaves a replica that may still hold its context."""
        replica.request_ids.discard(request_id)
        replica.pending_releases.add(request_id)

    async def probe_forever(self) -> None:
        while True:
            due = [r for r in self.replicas if self._probe_due(r)]
            await asyncio.gather(*(self._probe(r) for r in due))
            # Short: a replica suspected between two rounds of probes waits at most this long.
            await asyncio.sleep(min(self.probe_interval_s, 0.25))

    @staticmethod
    def _probe_due(replica: DraftReplica) -> bool:
        never_seen = not replica.healthy and replica.health.state == CLOSED
        return never_seen or replica.health.wants_probe()

    async def _probe(self, replica: DraftReplica) -> None:
        try:
            stub = health_pb2_grpc.HealthStub(replica.channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                raise _NotServing()
            info = await replica.stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=2.0)
            await self._flush_releases(replica)
        except (grpc.aio.AioRpcError, _NotServing):
            if replica.health.state != CLOSED and replica.health.probe_failed() and replica.healthy:
                self.mark_failed(replica, "suspected and not answering health checks")
            return
        replica.info = info
        was_in = replica.healthy
        replica.health.probe_passed()
        replica.healthy = True
        if not was_in:
            log.info("draft replica %s (%s) is serving", replica.address, info.method)

    async def _flush_releases(self, replica: DraftReplica) -> None:
        if replica.pending_releases:
            ids = sorted(replica.pending_releases)
            await replica.stub.Release(draft_pb2.ReleaseRequest(request_ids=ids), timeout=2.0)
            replica.pending_releases.difference_update(ids)

    async def release(self, replica: DraftReplica | None, request_id: str) -> None:
        if replica is None:
            return
        self.unassign(replica, request_id)
        if not replica.usable:
            replica.pending_releases.add(request_id)  # sent once it answers again
            return
        ids = sorted(replica.pending_releases | {request_id})
        try:
            await replica.stub.Release(
                draft_pb2.ReleaseRequest(request_ids=ids),
                timeout=max(0.05, replica.health.deadline_s("propose")),
            )
            replica.pending_releases.difference_update(ids)
        except grpc.aio.AioRpcError:
            replica.pending_releases.add(request_id)  # soft state: sent with a later release

    async def close(self) -> None:
        await asyncio.gather(*(r.channel.close() for r in self.replicas))
