"""Start-up's wait for the target: probe its health until it serves, then until it is this
router's (target_service/ownership.py), saying what it waits for.

A target that is still starting (a minute on a cold cache) refuses connections; the router
waits for it (10 minutes by default) and says so, then every 10 s what the last probe met, so a
wrong --target reads as one in the log instead of as a router that hangs without a word. A
target another router drives is waited for too (that router's claim lapses 5 s after it dies,
and at once when it stops), and the log names the other router.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from plumbing.grpc_util import CHANNEL_OPTIONS
from plumbing.security import ClientTLS, aio_channel
from protos import target_pb2
from router.target_client import TargetClient

log = logging.getLogger("splitspec.router")
REPORT_EVERY_S = 10.0
TARGET_SERVICE = target_pb2.DESCRIPTOR.services_by_name["TargetModel"].full_name
# What a gRPC server without the target service answers a health check by its name.
NOT_A_TARGET = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED)

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
            last = await _probe(stub, address)
            if not last:
                return
            if loop.time() >= next_report:
                log.info("still waiting for the target at %s after %.0f s: %s",
                         address, loop.time() - started, last)  # fmt: skip
                next_report += REPORT_EVERY_S
            await asyncio.sleep(0.25)
    raise SystemExit(f"router: target at {address} not healthy after {timeout_s:.0f} s ({last})")


async def _probe(stub: health_pb2_grpc.HealthStub, address: str) -> str:
    """'' when the target serves, else what the probe met. Asked by the target service's name,
    so that another gRPC server there (a draft, a router: a wrong --target) is said to be one
    at once, where it used to pass and the router died of an UNIMPLEMENTED GetInfo."""
    try:
        request = health_pb2.HealthCheckRequest(service=TARGET_SERVICE)
        reply = await stub.Check(request, timeout=2.0)
    except grpc.aio.AioRpcError as err:
        if err.code() in NOT_A_TARGET:
            raise SystemExit(
                f"router: {address} is not a target service (its health check does not know "
                f"{TARGET_SERVICE}: {err.code().name}); --target names the target service"
            ) from None
        return f"{err.code().name}: {err.details()}"
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return ""
    return f"health {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"


async def claim_target(target: TargetClient, timeout_s: float) -> None:
    """Returns once the target is this router's; until then, every 10 s, says whose it is."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_report = started
    while True:
        try:
            await target.claim()
            return
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise SystemExit(
                    f"router: the target at {target.address} takes no claims: it is older "
                    "than this router; run one version of both"
                ) from None
            last = err.details() or err.code().name
        if loop.time() >= started + timeout_s:
            raise SystemExit(f"router: the target at {target.address} was not free for "
                             f"{timeout_s:.0f} s: {last}")  # fmt: skip
        if loop.time() >= next_report:
            log.warning("waiting for the target at %s to be free: %s", target.address, last)
            next_report += REPORT_EVERY_S
        await asyncio.sleep(0.25)
