"""LocalStack must start services reliably from a process that already uses gRPC (a test
process talking to another stack, or `serve` after a health check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NUM_SPAWNS = 500

# A gRPC server and a channel that has made a call, as in a test session; then the launcher's
# own spawn path, many times. The child command is trivial: any crash happens before exec.
PROBE = f"""
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from splitspec.launcher import ServiceProcess

server = grpc.server(futures.ThreadPoolExecutor(2))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{{port}}")
health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
codes = []
for _ in range({NUM_SPAWNS}):
    child = ServiceProcess("child", ["/bin/true"], "")
    child.start()
    codes.append(child.process.wait())
print(sum(code != 0 for code in codes), sorted(set(codes)))
"""


def test_services_start_from_a_process_that_uses_grpc() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    num_failed, codes = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(num_failed) == 0, f"{num_failed} of {NUM_SPAWNS} children died before exec: {codes}"


def test_a_stack_gets_distinct_ports_for_all_its_services() -> None:
    from splitspec.launcher import LocalStack, free_ports

    # gRPC servers bind with SO_REUSEPORT: two services handed one port would share it. Probing
    # one port at a time (bind, close, repeat) repeated a port within 500 picks in 20 of 20
    # tries on the dev box; picks made together never may.
    ports = free_ports(500)
    assert len(set(ports)) == 500
    stack = LocalStack([], [], draft_args=[[], [], []])
    addresses = [s.address for s in stack.services()]
    assert len(set(addresses)) == len(addresses) == 5
