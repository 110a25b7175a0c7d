"""The draft replicas: assignment (a request sticks to one), failure and recovery.

A replica that fails a call is marked unhealthy and loses its requests; they continue
target-only and move to another replica after catch-up. A background probe brings a
recovered replica back (empty: requests re-ingest their context when assigned to it).
Replicas found by DNS (router.discovery) join through the same probe and leave like a
failed replica, so a request never notices more than a few target-only steps.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import draft_pb2, draft_pb2_grpc
from splitspec.grpc_util import CHANNEL_OPTIONS

log = logging.getLogger("splitspec.router")
DRAFT_SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftModel"].full_name
STATIC = "static"


@dataclass(eq=False)
class DraftReplica:
    address: str
    channel: grpc.aio.Channel
    stub: draft_pb2_grpc.DraftModelStub
    info: draft_pb2.DraftInfo | None = None
    healthy: bool = False
    request_ids: set[str] = field(default_factory=set)
    source: str = STATIC  # or the DNS name it was found under
    error: str = "not probed yet"  # why it is not serving; "" while healthy

    @classmethod
    def connect(cls, address: str, source: str = STATIC) -> DraftReplica:
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        return cls(address, channel, draft_pb2_grpc.DraftModelStub(channel), source=source)

    def set_error(self, error: str) -> None:
        """Logs each new reason once (a probe repeats every second)."""
        if error and error != self.error:
            log.warning("draft replica %s (%s) not usable: %s", self.address, self.source, error)
        self.error = error


class DraftPool:
    def __init__(
        self, addresses: list[str], timeout_s: float, probe_interval_s: float = 1.0
    ) -> None:
        self.replicas = [DraftReplica.connect(a) for a in addresses]
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        self._closing: set[asyncio.Task] = set()

    def add(self, address: str, source: str) -> DraftReplica:
        """A new replica; it serves requests once the probe finds it healthy."""
        replica = DraftReplica.connect(address, source)
        self.replicas.append(replica)
        log.info("draft replica %s joins (from %s), probing it", address, source)
        return replica

    def remove(self, replica: DraftReplica, reason: str) -> None:
        """Out of the pool; its requests continue target-only and then move."""
        self.mark_failed(replica, reason)
        self.replicas.remove(replica)
        log.info("draft replica %s leaves (%s)", replica.address, reason)
        # Calls still in flight end or fail on their own deadline; then the channel goes.
        task = asyncio.ensure_future(replica.channel.close(grace=self.timeout_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

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
        replica.error = reason
        lost, replica.request_ids = replica.request_ids, set()
        return lost

    async def probe_forever(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.probe_interval_s)

    async def probe_once(self) -> None:
        """Health-checks every replica out of rotation; the serving ones come back."""
        await asyncio.gather(*(self._probe(r) for r in list(self.replicas) if not r.healthy))

    async def _probe(self, replica: DraftReplica) -> None:
        error = await self._check(replica)
        if replica not in self.replicas:
            return  # left while the probe ran
        replica.set_error(error)
        if error or replica.info is None:
            return
        replica.healthy = True
        log.info("draft replica %s (%s) is serving", replica.address, replica.info.method)

    async def _check(self, replica: DraftReplica) -> str:
        """What keeps the address from serving drafts ("" for nothing). Asking for the draft
        service's health by name tells a draft apart from any other gRPC server."""
        stub = health_pb2_grpc.HealthStub(replica.channel)
        request = health_pb2.HealthCheckRequest(service=DRAFT_SERVICE)
        try:
            reply = await stub.Check(request, timeout=1.0)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                return f"not a draft service (health of {DRAFT_SERVICE}: {err.code().name})"
            return f"unreachable ({err.code().name})"
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return f"draft service not serving ({status})"
        try:
            replica.info = await replica.stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=2.0)
        except grpc.aio.AioRpcError as err:
            return f"GetInfo failed ({err.code().name})"
        return ""

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
        await asyncio.gather(*(r.channel.close() for r in self.replicas), *self._closing)
