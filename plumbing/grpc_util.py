"""gRPC plumbing shared by every service: channel/server options, health and reflection."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from plumbing.security import ClientTLS, ServerTLS, bind, sync_channel

# Explicit limits everywhere: hidden states travel in chunks well under these.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Servers take a client's keepalive pings while its long-lived streams (plumbing/rpc_stream.py)
    # idle: by default a ping more often than every 5 minutes without data is a strike, and after
    # two the server sends GOAWAY "too_many_pings", cancelling every call on the connection.
    ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
]

# gRPC servers bind with SO_REUSEPORT by default, so a second service started on a port in use
# (a router started twice, a stale target from an earlier run) binds too, and the kernel splits
# new connections between the two without a word. Ours refuse: the second one fails to bind.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]

# For the router's channels to the services it drives: a service back after a restart is
# reached within a second, where gRPC's default backoff (x1.6 a failure) grows to two minutes.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# The metadata key a router names itself by on every call to its target
# (target_service/ownership.py): the target takes one router's calls at a time.
ROUTER_ID_KEY = "splitspec-router-id"


# A service still starting refuses connections, and a refused channel waits out gRPC's reconnect
# backoff (1 s at first) before it tries again: a poll at that pace saw a service up to a second
# after it was, at every stack start. Reconnecting to a local port costs next to nothing.
_POLL_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 200),
]


def add_health_and_reflection(
    server: grpc.Server, service_names: Iterable[str]
) -> health.HealthServicer:
    """Registers grpc.health.v1 (every service SERVING) and reflection on a sync server;
    returns the health servicer (a drain turns it NOT_SERVING)."""
    names = list(service_names)
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ["", *names]:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _add_reflection(server, names)
    return servicer


async def add_health_and_reflection_aio(
    server: grpc.aio.Server, service_names: Iterable[str]
) -> health_aio.HealthServicer:
    """The same for an asyncio server, whose health servicer is async; returns it (its owner may
    turn it NOT_SERVING)."""
    names = list(service_names)
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ["", *names]:
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _add_reflection(server, names)
    return servicer


def start_server(
    server: grpc.Server,
    service_names: Iterable[str],
    address: str,
    name: str,
    tls: ServerTLS | None = None,
) -> tuple[health.HealthServicer, str]:
    """Adds health + reflection, binds ``address`` (TLS when given; or exits saying why) and
    starts; returns the health servicer (a drain turns it NOT_SERVING) and the bound address."""
    servicer = add_health_and_reflection(server, service_names)
    bound = bind_or_exit(server, address, tls, name)
    server.start()
    return servicer, bound


def bind_or_exit(
    server: grpc.Server | grpc.aio.Server, address: str, tls: ServerTLS | None, name: str
) -> str:
    """Binds ``address`` (TLS when given) or exits saying why: grpcio raises a bare "Failed
    to bind" (or returns 0) for a port in use and for an address not of this host alike.
    Returns the address bound: port 0 becomes the port the system chose, for the logs."""
    try:
        bound = bind(server, address, tls)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise SystemExit(
            f"{name}: cannot bind {address}: the port is in use (another service on it?) or "
            "the host is not an address of this machine; choose another --port or --host"
        )
    return f"{address.rsplit(':', 1)[0]}:{bound}"


def _add_reflection(server: grpc.Server | grpc.aio.Server, names: list[str]) -> None:
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )


def wait_healthy(
    address: str, timeout_s: float, service: str = "", tls: ClientTLS | None = None
) -> bool:
    """Polls grpc.health.v1 until SERVING or the timeout passes."""
    import time

    deadline = time.monotonic() + timeout_s
    with sync_channel(address, tls, _POLL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False
