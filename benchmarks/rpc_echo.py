"""The floor of benchmarks/rpc_overhead.py: a bare gRPC echo server of the same message sizes
(grpc.aio or sync, unary or stream) in its own process, and its launcher.

  python -m benchmarks.rpc_echo --echo-server aio|sync --port N   (rpc_overhead starts it)
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from plumbing.grpc_util import CHANNEL_OPTIONS
from splitspec.launcher import ServiceProcess, free_ports, python_module

ECHO_METHOD = "/splitspec.bench.Echo/Echo"


def _echo(request: bytes, context: Any) -> bytes:
    (reply_len,) = struct.unpack_from("<I", request)
    return bytes(reply_len)


def _echo_stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
    for request in requests:
        yield _echo(request, context)


async def _aio_echo(request: bytes, context: Any) -> bytes:
    return _echo(request, context)


def _echo_handler(unary: Callable) -> grpc.GenericRpcHandler:
    methods = {  # bytes in, bytes out: no protobuf
        "Echo": grpc.unary_unary_rpc_method_handler(unary),
        "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
    }
    return grpc.method_handlers_generic_handler("splitspec.bench.Echo", methods)


async def _aio_echo_server(port: int) -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((_echo_handler(_aio_echo),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_echo(kind: str, port: int) -> None:
    if kind == "aio":
        asyncio.run(_aio_echo_server(port))
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((_echo_handler(_echo),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


# ---- the services ----------------------------------------------------------------------------


def start_echo(kind: str, log_dir: Path) -> ServiceProcess:
    (port,) = free_ports(1)
    echo = ServiceProcess(
        f"echo-{kind}",
        python_module("benchmarks.rpc_echo", "--echo-server", kind, "--port", str(port)),
        f"127.0.0.1:{port}",
        log_dir / f"echo-{kind}.log",
    )
    echo.start()
    _wait_port(echo)
    return echo


def _wait_port(echo: ServiceProcess) -> None:
    deadline = time.monotonic() + 60.0
    with grpc.insecure_channel(echo.address) as channel:
        while time.monotonic() < deadline:
            try:
                grpc.channel_ready_future(channel).result(timeout=1.0)
                return
            except grpc.FutureTimeoutError:
                continue
    raise TimeoutError(f"{echo.name} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--echo-server", choices=("aio", "sync"), required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve_echo(args.echo_server, args.port)


if __name__ == "__main__":
    main()
