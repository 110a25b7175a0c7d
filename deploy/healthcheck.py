#!/usr/bin/env python3
"""Container health check: grpc.health.v1 of the service that runs as PID 1.

The port is read from PID 1's own --port flag (else the service's default), so one
command fits every image and any flags. Exit 0 when SERVING, 1 otherwise.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_PORTS = {"router": 50051, "target_service": 50061, "draft_service": 50071}


def service_port() -> int:
    with open("/proc/1/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    pairs = list(zip(argv, argv[1:], strict=False))
    ports = [value for flag, value in pairs if flag == "--port"]
    ports += [a.split("=", 1)[1] for a in argv if a.startswith("--port=")]
    if ports:
        return int(ports[-1])  # argparse keeps the last one
    module = next((value for flag, value in pairs if flag == "-m"), "")
    return DEFAULT_PORTS.get(module, 50051)


def main() -> int:
    address = f"127.0.0.1:{service_port()}"
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2.0
            )
        except grpc.RpcError as err:
            print(f"{address}: {err.code().name}", file=sys.stderr)
            return 1
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
