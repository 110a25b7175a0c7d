"""Graceful shutdown: on SIGTERM (or SIGINT) the router drains, then stops.

Draining: health turns NOT_SERVING (load balancers stop sending), new requests are refused
UNAVAILABLE, and requests already admitted run to their end, for at most ``grace_s``; then the
server stops (streams still open after the grace period are cancelled) and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable

import grpc
from grpc_health.v1 import health_pb2

from router.scheduler import Scheduler

log = logging.getLogger("splitspec.router")


def install(
    server: grpc.aio.Server,
    scheduler: Scheduler,
    health,  # the public server's grpc_health.v1 aio servicer
    service_names: Iterable[str],
    grace_s: float = 30.0,
) -> asyncio.Event:
    """Returns an event set once the drain is over and the server stopped."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    names = ["", *service_names]

    async def drain() -> None:
        log.info("draining: %d requests in flight, at most %.0f s", len(scheduler.in_flight),
                 grace_s)
        scheduler.target_unavailable = "the router is shutting down"
        for name in names:
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        deadline = loop.time() + grace_s
        while scheduler.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await server.stop(grace=1.0)
        log.info("drained; stopping")
        stopped.set()

    draining: set[asyncio.Task] = set()  # holds the task (the loop keeps only a weak ref)

    def on_signal() -> None:
        if not draining:
            draining.add(loop.create_task(drain()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    return stopped
