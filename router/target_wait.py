"""Start-up's wait for the target: probe its health until it serves, saying what it waits for.

A target that is still starting (a minute on a cold cache) refuses connections; the router
waits for it (10 minutes by default) and says so, then every 10 s what the last probe met, so a
wrong --target reads as one in the log instead of as a router that hangs without a word.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from plumbing.grpc_util import CHANNEL_OPTIONS
from plumbing.security import ClientTLS, aio_channel

log = logging.getLogger("splitspec.router")
REPORT_EVERY_S = 10.0

# At gRPC's default reconnect backoff (x1.6 up to 120 s) the router noticed a target up to ~20 s
# late, and with the backoff growing to 1 s, up to a second late at every start. A refused
# connection costs next to nothing: the probe tries every 250 ms.
PROBE_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 250),
]


async def wait_for_target(address: str, timeout_s: float, tls: ClientTLS | None = None) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_report = started + REPORT_EVERY_S
    last = "no answer yet"
    log.info("waiting for the target at %s (up to %.0f s)", address, timeout_s)
    async with aio_channel(address, tls, PROBE_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while loop.time() < started + timeout_s:
            last = await _probe(stub)
            if not last:
                return
            if loop.time() >= next_report:
                log.info("still waiting for the target at %s after %.0f s: %s",
                         address, loop.time() - started, last)  # fmt: skip
                next_report += REPORT_EVERY_S
            await asyncio.sleep(0.25)
    raise SystemExit(f"router: target at {address} not healthy after {timeout_s:.0f} s ({last})")


async def _probe(stub: health_pb2_grpc.HealthStub) -> str:
    """'' when the target serves, else what the probe met."""
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
    except grpc.aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()}"
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return ""
    return f"health {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
