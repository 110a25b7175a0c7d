"""The draft replicas: assignment (a request sticks to one), failure and recovery.

A replica that fails a call is marked unhealthy and loses its requests; they continue
target-only and move to another replica after catch-up. A background probe (what it asks:
router/replica_check.py) brings a recovered replica back (empty: requests re-ingest their
context when assigned to it).
A replica that only runs past its deadline is first suspected, not ejected: see
router/replica_health.py. Releases a replica cannot take now are kept and sent once it answers.
Replicas found by DNS (router.discovery) join through the same probe and leave like a
failed replica, so a request never notices more than a few target-only steps.
An idle replica in rotation is health-checked too, every probe interval: one that dies between
requests leaves the status (and the replicas that requests are given) at once, not when the next
request meets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import grpc

from plumbing.grpc_util import CHANNEL_OPTIONS, RECONNECT_OPTIONS
from plumbing.rpc_stream import StreamedUnary
from plumbing.security import ClientTLS, aio_channel
from protos import draft_pb2, draft_pb2_grpc, target_pb2
from router import telemetry
from router.replica_check import admission_error, health_error
from router.replica_health import CLOSED, OPEN, DeadlinePolicy, ReplicaHealth

log = logging.getLogger("splitspec.router")
STATIC = "static"


@dataclass(eq=False)
class DraftReplica:
    address: str
    channel: grpc.aio.Channel
    stub: draft_pb2_grpc.DraftModelStub
    # Propose over a stream of its own (plumbing/rpc_stream.py): a fraction of a unary call.
    propose: StreamedUnary[draft_pb2.ProposeRequest, draft_pb2.ProposeResponse]
    info: draft_pb2.DraftInfo | None = None
    healthy: bool = False  # in rotation (not ejected); health says whether to call it now
    request_ids: set[str] = field(default_factory=set)
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    pending_releases: set[str] = field(default_factory=set)
    source: str = STATIC  # or the DNS name it was found under
    error: str = "not probed yet"  # why it is not serving; "" while healthy
    warned_cut: bool = False  # said once that its trees exceed the router's --max-tree-tokens
    checked_at: float = 0.0  # the last health check while idle in rotation (monotonic)
    swept: bool = False  # told to drop what other routers left (once, before it first serves)

    @property
    def usable(self) -> bool:
        return self.healthy and self.health.callable

    @classmethod
    def connect(
        cls, address: str, tls: ClientTLS | None = None, source: str = STATIC
    ) -> DraftReplica:
        channel = aio_channel(address, tls, [*CHANNEL_OPTIONS, *RECONNECT_OPTIONS])
        stub = draft_pb2_grpc.DraftModelStub(channel)
        return cls(address, channel, stub, StreamedUnary(stub.ProposeStream), source=source)

    def set_error(self, error: str) -> None:
        """Logs each new reason once (a probe repeats every second)."""
        if error and error != self.error:
            log.warning("draft replica %s (%s) not usable: %s", self.address, self.source, error)
        self.error = error


class DraftPool:
    def __init__(
        self,
        addresses: list[str],
        timeout_s: float,
        probe_interval_s: float = 1.0,
        tls: ClientTLS | None = None,
        deadline_floor_s: float = 0.02,
        max_tree_tokens: int = 0,
        target: target_pb2.TargetInfo | None = None,
    ) -> None:
        self.tls = tls
        self.target = target  # what a replica must draft for (None: not checked)
        self.max_tree_tokens = max_tree_tokens  # the router's: larger trees are cut (0: none)
        self.deadline_floor_s = min(deadline_floor_s, timeout_s)
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        self.replicas: list[DraftReplica] = []
        self._closing: set[asyncio.Task] = set()
        for address in addresses:
            self._join(DraftReplica.connect(address, tls))

    def _join(self, replica: DraftReplica) -> DraftReplica:
        policy = DeadlinePolicy(floor_s=self.deadline_floor_s, cap_s=self.timeout_s)
        replica.health = ReplicaHealth(policy)
        self.replicas.append(replica)
        return replica

    def add(self, address: str, source: str) -> DraftReplica:
        """A new replica; it serves requests once the probe finds it healthy."""
        log.info("draft replica %s joins (from %s), probing it", address, source)
        return self._join(DraftReplica.connect(address, self.tls, source))

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
        replica.error = reason
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
            await self.probe_once()
            # Short: a replica suspected between two rounds of probes waits at most this long.
            await asyncio.sleep(min(self.probe_interval_s, 0.25))

    async def probe_once(self) -> None:
        """Health-checks the replicas that are out of rotation or suspected, and the idle ones
        in rotation that were not checked for a probe interval."""
        due = [r for r in list(self.replicas) if self._probe_due(r)]
        idle = [r for r in list(self.replicas) if self._idle_check_due(r)]
        await asyncio.gather(*(self._probe(r) for r in due), *(self._check_idle(r) for r in idle))

    @staticmethod
    def _probe_due(replica: DraftReplica) -> bool:
        never_seen = not replica.healthy and replica.health.state == CLOSED
        return never_seen or replica.health.wants_probe()

    def _idle_check_due(self, replica: DraftReplica) -> bool:
        """A replica serving requests is checked by their calls every step; an idle one is not."""
        if not replica.usable or replica.request_ids:
            return False
        return time.monotonic() - replica.checked_at >= self.probe_interval_s

    async def _check_idle(self, replica: DraftReplica) -> None:
        replica.checked_at = time.monotonic()
        error = await health_error(replica.channel)
        # Taken out only while still idle: one given requests meanwhile is judged by their calls.
        if error and replica in self.replicas and replica.usable and not replica.request_ids:
            # Ejecting an idle replica loses nothing: no request holds a context there.
            reason = f"health check while idle: {error}"
            telemetry.observer().draft_failure(replica.address, reason)
            self.mark_failed(replica, reason)

    async def _probe(self, replica: DraftReplica) -> None:
        error = await admission_error(replica, self.target, self.max_tree_tokens)
        if replica not in self.replicas:
            return  # left while the probe ran
        replica.set_error(error)
        if error:
            if replica.health.state != CLOSED and replica.health.probe_failed() and replica.healthy:
                self.mark_failed(replica, "suspected and not answering health checks")
            return
        was_in = replica.healthy
        replica.health.probe_passed()
        replica.healthy = True
        if not was_in and replica.info is not None:
            log.info("draft replica %s (%s) is serving", replica.address, replica.info.method)

    async def release(self, replica: DraftReplica | None, request_id: str) -> None:
        if replica is None:
            return
        self.unassign(replica, request_id)
        if not replica.usable:
            replica.pending_releases.add(request_id)  # sent once it answers again
            return
        ids = sorted(replica.pending_releases | {request_id})
        # The step waits for this: a miss suspects the replica like a missed Propose, so a
        # replica that hangs costs the step one wait, not one a call (Release, then Propose).
        health = replica.health
        deadline = max(0.05, health.deadline_s("propose"))
        try:
            await replica.stub.Release(draft_pb2.ReleaseRequest(request_ids=ids), timeout=deadline)
            replica.pending_releases.difference_update(ids)
        except grpc.aio.AioRpcError as err:
            replica.pending_releases.add(request_id)  # soft state: sent with a later release
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and health.callable:
                self.missed(replica, f"Release ({deadline * 1e3:.0f} ms)")

    async def close(self) -> None:
        await asyncio.gather(*(r.channel.close() for r in self.replicas), *self._closing)
