"""What CPU idle states add to an RPC (``--keep-cpus-awake``, plumbing/cpu_wake.py).

A gRPC stream echo from a grpc.aio client (the router's kind) to a sync server with a thread
pool (the services' kind), each in its own process, one call at a time, as three shapes: back
to back; with the handler busy for 1 ms (a service waiting on its device spins); and with
that plus 2 ms between calls (the rest of a round elsewhere), where cores have time to idle.
Each shape runs with nothing held, with a PM QoS hold of 0 us (a holder process) and with idle
spinners on every CPU (plumbing/cpu_spin.py), in turn, and reports the median of the call's
time beyond the handler's work.

    python -m benchmarks.rpc_wake [--repeats 3] [--modes plain qos spin] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from benchmarks.run_record import REPO_ROOT, machine_info, utc_now, versions
from plumbing import cpu_spin, cpu_wake
from splitspec.launcher import free_ports

SHAPES = [(0.0, 0.0), (1.0, 0.0), (1.0, 2.0)]  # (handler work ms, gap between calls ms)
CALLS, WARMUP = 300, 20
MODES = ["plain", "qos", "spin"]
DEFAULT_OUT = REPO_ROOT / "benchmarks/results/rpc_wake_cpu.json"


def serve(port: int, work_s: float) -> None:
    def echo(requests: Iterator[bytes], context) -> Iterator[bytes]:
        for request in requests:
            began = time.perf_counter()
            while time.perf_counter() - began < work_s:  # busy, as a thread waiting on a GPU
                pass
            yield request

    handler = grpc.method_handlers_generic_handler(
        "bench.Wake", {"Echo": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def overhead_ms(port: int, work_s: float, gap_s: float) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        call = channel.stream_stream("/bench.Wake/Echo")()
        times = []
        for _ in range(CALLS):
            began = time.perf_counter()
            await call.write(bytes(64))
            await call.read()
            times.append((time.perf_counter() - began - work_s) * 1e3)
            if gap_s:
                await asyncio.sleep(gap_s)
        call.cancel()
    return round(statistics.median(times[WARMUP:]), 4)


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.rpc_wake", *args], cwd=REPO_ROOT)


def measure(work_ms: float, gap_ms: float) -> float:
    (port,) = free_ports(1)
    server = _child("--serve", str(port), str(work_ms / 1e3))
    try:
        return asyncio.run(asyncio.wait_for(overhead_ms(port, work_ms / 1e3, gap_ms / 1e3), 120))
    finally:
        server.kill()
        server.wait()


def _hold_pm_qos() -> subprocess.Popen:
    holder = _child("--hold")
    deadline = time.monotonic() + 30
    while cpu_wake.current_limit_us() != 0:
        if holder.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the holder could not set the PM QoS limit")
        time.sleep(0.05)
    return holder


def run_shapes(mode: str) -> dict[str, float]:
    """The shapes' overheads with nothing held ("plain"), a PM QoS hold of 0 ("qos"), or idle
    spinners on every CPU ("spin", plumbing/cpu_spin.py)."""
    # Each a list of processes to end afterwards (spin's start() returns one Popen: iterated
    # as it was, the spin mode failed at its end).
    starters: dict[str, Callable[[], list]] = {
        "plain": list, "qos": lambda: [_hold_pm_qos()], "spin": lambda: [cpu_spin.start()]
    }  # fmt: skip
    helpers = starters[mode]()
    try:
        return {f"work_{w:g}ms_gap_{g:g}ms": measure(w, g) for w, g in SHAPES}
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--machine-name", default="2-core dev box")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)  # PORT WORK_S (a child)
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)  # (a child)
    args = parser.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), float(args.serve[1]))
        return
    if args.hold:
        if cpu_wake.keep_cpus_awake():
            time.sleep(3600)
        return
    if "qos" in args.modes and cpu_wake.current_limit_us() == 0:
        raise SystemExit("another process holds the PM QoS limit at 0: nothing to compare")
    runs = []
    for repeat in range(args.repeats):
        for mode in args.modes:
            row = {"repeat": repeat, "mode": mode, "overhead_ms": run_shapes(mode)}
            print(json.dumps(row), flush=True)
            runs.append(row)
    report = {"when": utc_now(), "machine_name": args.machine_name, "machine": machine_info(1),
              "versions": versions(), "calls": CALLS, "warmup": WARMUP, "runs": runs}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
