"""What an internal RPC costs beyond the service's own work (issue 16, "a lean round").

Starts a real target and an EAGLE draft replica on the CPU (``--device cuda``: on the GPU,
with their graphs), on the tests' tiny Llama (one layer, hidden 32 by default;
``--hidden-size 576`` gives the default model's wire sizes) with the tests' oracle head, and
calls them the way the router does (grpc.aio stubs, the router's channel options), one call at
a time:

- Forward: one decode token of one request (``forward_ms`` is the target's work);
- Verify: a 16-node tree, hidden rows back (``forward_ms``);
- Propose: one request's round update (3 tokens, 3 hidden rows) and its tree (``compute_ms``);
- Ingest: a 65-token context with 64 hidden rows in one chunk (``compute_ms``).

Per kind: the median client-observed latency, the median service-reported work, and the median
of their per-call difference (the RPC's overhead). The floor is a bare echo of the same request
and reply sizes, on a grpc.aio server and on a sync server with a thread pool (how the services
serve), each in a process of its own.

    python -m benchmarks.rpc_overhead --label before --out benchmarks/results/rpc_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from benchmarks.rpc_calls import PROMPT_LEN, ROUND_TOKENS, TREE_PARENTS, Bench, measure_kinds
from benchmarks.rpc_echo import ECHO_METHOD, start_echo
from benchmarks.run_record import REPO_ROOT, git_commit, machine_info, save_run, utc_now, versions
from plumbing.grpc_util import CHANNEL_OPTIONS
from splitspec.launcher import ServiceProcess, free_ports, python_module

DEFAULT_OUT = REPO_ROOT / "benchmarks/results/rpc_overhead.json"
FLOORS = [  # (name, echo server, over a stream)
    ("unary_aio_server", "aio", False),
    ("unary_sync_server", "sync", False),
    ("stream_sync_server", "sync", True),
]


# ---- the services ----------------------------------------------------------------------------


def model_dirs(root: Path, hidden_size: int) -> tuple[Path, Path]:
    """The tests' end-to-end tiny Llama at ``hidden_size`` and its oracle EAGLE head."""
    from tests.helpers.tiny_llama import E2E_MODEL, tiny_llama_dir, write_oracle_head

    heads = max(1, hidden_size // 16 if hidden_size % 16 == 0 else 1)
    shape = replace(E2E_MODEL, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                    num_heads=heads, num_kv_heads=max(1, heads // 2))  # fmt: skip
    model = tiny_llama_dir(root, shape)
    head = model.with_name(model.name + "-oracle-head")
    if not (head / "eagle_config.json").is_file():
        write_oracle_head(model, head)
    return model, head


def start_services(
    model: Path, head: Path, log_dir: Path, args: argparse.Namespace
) -> list[ServiceProcess]:
    target_port, draft_port = free_ports(2)
    cpu = ["--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    eagle = ["--model", str(model), "--eagle-head", str(head), *cpu]
    pool = ["--num-slots", "4096", "--max-context", "2048"]
    target = ServiceProcess(
        "target",
        python_module(
            "target_service", "--port", str(target_port), "--model", str(model), *cpu, *pool
        ),
        f"127.0.0.1:{target_port}",
        log_dir / "target.log",
    )
    draft = ServiceProcess(
        "draft",
        python_module("draft_service", "--port", str(draft_port), "--method", "eagle", *eagle),
        f"127.0.0.1:{draft_port}",
        log_dir / "draft.log",
    )
    for service in (target, draft):
        service.start()
    for service in (target, draft):
        service.wait_healthy(300.0)
    return [target, draft]


# ---- the echo floor --------------------------------------------------------------------------


async def measure_echo(
    address: str, sizes: dict[str, tuple[int, int]], num_calls: int, warmup: int, stream: bool
) -> dict[str, float]:
    """Median round trip of a bare echo with each kind's request and reply sizes."""
    from plumbing.rpc_stream import StreamedUnary

    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        echo: Any = channel.unary_unary(ECHO_METHOD)
        if stream:
            echo = StreamedUnary(channel.stream_stream(ECHO_METHOD + "Stream"))
        out = {}
        for name, (request_bytes, reply_bytes) in sizes.items():
            payload = struct.pack("<I", int(reply_bytes)) + bytes(max(0, request_bytes - 4))
            times = []
            for i in range(warmup + num_calls):
                began = time.perf_counter()
                await echo(payload, timeout=30)
                if i >= warmup:
                    times.append((time.perf_counter() - began) * 1e3)
            out[name] = round(statistics.median(times), 4)
    return out


# ---- the run ---------------------------------------------------------------------------------


async def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    model, head = model_dirs(work_dir, args.hidden_size)
    services = start_services(model, head, work_dir, args)
    echoes = {kind: start_echo(kind, work_dir) for kind in ("aio", "sync")}
    transports = ["unary"] + (["stream"] if args.streams else [])
    try:
        bench = Bench(services[0].address, services[1].address)
        await bench.setup()
        kinds = {t: await measure_kinds(bench, t, args.num_calls, args.warmup) for t in transports}
        await bench.close()
        sizes = {k: (v["request_bytes"], v["reply_bytes"]) for k, v in kinds["unary"].items()}
        n, w = args.num_calls, args.warmup
        floors = {}
        for name, kind, stream in FLOORS:
            address = echoes[kind].address
            floors[name] = await measure_echo(address, sizes, n, w, stream)
    finally:
        for service in [*services, *echoes.values()]:
            service.stop()
    print("echo floors (ms):", json.dumps(floors), flush=True)
    return {
        "label": args.label, "when": utc_now(), "machine_name": args.machine_name,
        "machine": machine_info(args.threads), "versions": versions(), "commit": git_commit(),
        "config": {"device": args.device, "dtype": args.dtype,
                   "hidden_size": args.hidden_size, "num_calls": args.num_calls,
                   "warmup": args.warmup, "service_threads": args.threads,
                   "prompt_len": PROMPT_LEN, "tree_nodes": len(TREE_PARENTS),
                   "round_tokens": ROUND_TOKENS},
        "kinds": kinds, "echo_ms": floors,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--machine-name", default="2-core dev box")
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--num-calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--no-streams",
        dest="streams",
        action="store_false",
        help="unary calls only (services from before the *Stream methods)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each service")
    parser.add_argument("--device", default="cpu", help="the services' device (cpu, cuda)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--work-dir", type=Path, default=None, help="model folders and logs")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.gettempdir()) / "splitspec-rpc-overhead"
    work_dir.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args, work_dir))
    save_run(args.out, args.label, report)
    print(f"wrote {args.out} ({args.label})")


if __name__ == "__main__":
    main()
