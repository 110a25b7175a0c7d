"""Graceful drain on SIGTERM, as Kubernetes and container engines stop a service.

On SIGTERM a service turns its health NOT_SERVING (readiness fails, so no new traffic is
routed to it), stops accepting calls, and exits once the calls in flight have finished, or
when a grace period ($SPLITSPEC_DRAIN_S, else the service's default) ends them. A request on a
client's open stream (plumbing/rpc_stream.py) counts as a call: the stream takes no more. A
container's PID 1 has no default action for SIGTERM at all: without a handler it would ignore
it and be SIGKILLed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import grpc
from grpc_health.v1 import health
from grpc_health.v1.health import aio as health_aio

from plumbing.rpc_stream import StreamGate

log = logging.getLogger("splitspec.drain")
GRACE_ENV = "SPLITSPEC_DRAIN_S"


def grace_s(default: float) -> float:
    value = os.environ.get(GRACE_ENV)
    return float(value) if value else default


def drain_on_sigterm(
    server: grpc.Server, servicer: health.HealthServicer, grace: float, streams: StreamGate
) -> None:
    """For a sync server; call from the main thread before wait_for_termination. ``streams``
    serve the server's *Stream methods: each request on them is a call of its own."""

    def on_sigterm(signum: int, frame: object) -> None:
        log.info("SIGTERM: draining, calls in flight get up to %.0f s", grace)
        servicer.enter_graceful_shutdown()
        server.stop(grace)  # returns at once; wait_for_termination ends when done
        # Without this, a client's open stream would keep taking calls for the whole grace.
        streams.close()

    signal.signal(signal.SIGTERM, on_sigterm)


def drain_aio_on_sigterm(
    server: grpc.aio.Server, servicer: health_aio.HealthServicer, grace: float
) -> None:
    """For an asyncio server; call inside its running loop."""
    tasks: set[asyncio.Task] = set()

    async def drain() -> None:
        log.info("SIGTERM: draining, streams in flight get up to %.0f s", grace)
        await servicer.enter_graceful_shutdown()
        await server.stop(grace)

    def on_sigterm() -> None:
        if not tasks:  # a second SIGTERM changes nothing
            tasks.add(asyncio.ensure_future(drain()))

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
