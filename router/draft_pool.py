"""The draft replicas: assignment (a request sticks to one), failure and recovery.

A replica that fails a call is marked unhealthy and loses its requests; they continue
target-only and move to another replica after catch-up. A background probe brings a
recovered replica back (empty: requests re-ingest their context when assigned to it).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import draft_pb2, draft_pb2_grpc
from splitspec.grpc_util import CHANNEL_OPTIONS
from splitspec.security import ClientTLS, aio_channel

log = logging.getLogger("splitspec.router")


@dataclass(eq=False)
class DraftReplica:
    address: str
    channel: grpc.aio.Channel
    stub: draft_pb2_grpc.DraftModelStub
    info: draft_pb2.DraftInfo | None = None
    healthy: bool = False
    request_ids: set[str] = field(default_factory=set)

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

    @property
    def healthy(self) -> list[DraftReplica]:
        return [r for r in self.replicas if r.healthy]

    def assign(self, request_id: str) -> DraftReplica | None:
        """The least-loaded healthy replica, or None (the request runs target-only)."""
        candidates = self.healthy
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
        lost, replica.request_ids = replica.request_ids, set()
        return lost

    async def probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(r) for r in self.replicas if not r.healthy))
            await asyncio.sleep(self.probe_interval_s)

    async def _probe(self, replica: DraftReplica) -> None:
        try:
            stub = health_pb2_grpc.HealthStub(replica.channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return
            replica.info = await replica.stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return
        replica.healthy = True
        log.info("draft replica %s (%s) is serving", replica.address, replica.info.method)

    async def release(self, replica: DraftReplica | None, request_id: str) -> None:
        if replica is None:
            return
        self.unassign(replica, request_id)
        if not replica.healthy:
            return
        try:
            await replica.stub.Release(
                draft_pb2.ReleaseRequest(request_ids=[request_id]), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError:
            pass  # soft state: a replica that missed a release only wastes memory until restart

    async def close(self) -> None:
        await asyncio.gather(*(r.channel.close() for r in self.replicas))
