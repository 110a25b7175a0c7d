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
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from benchmarks.rpc_echo import ECHO_METHOD, start_echo
from benchmarks.run_record import REPO_ROOT, git_commit, machine_info, save_run, utc_now, versions
from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from splitspec.launcher import ServiceProcess, free_ports, python_module

PROMPT_LEN = 64
TREE_PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2, 3, 5, 5, 6, 7, 9, 10, 11]  # 16 nodes, EAGLE-like
ROUND_TOKENS = 3  # tokens (and hidden rows) a round commits: the CPU tree's ~3 per step
DEFAULT_OUT = REPO_ROOT / "benchmarks/results/rpc_overhead.json"
MAX_DRAFT_CONTEXT = 1500
FLOORS = [  # (name, echo server, over a stream)
    ("unary_aio_server", "aio", False),
    ("unary_sync_server", "sync", False),
    ("stream_sync_server", "sync", True),
]  # re-ingest before the draft context grows past it


# ---- the echo floor --------------------------------------------------------------------------


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


# ---- the calls -------------------------------------------------------------------------------


class Bench:
    """One request on the target and on the draft replica, driven call by call."""

    def __init__(self, target_address: str, draft_address: str) -> None:
        self.target_channel = grpc.aio.insecure_channel(target_address, options=CHANNEL_OPTIONS)
        self.draft_channel = grpc.aio.insecure_channel(draft_address, options=CHANNEL_OPTIONS)
        self.target = target_pb2_grpc.TargetModelStub(self.target_channel)
        self.draft = draft_pb2_grpc.DraftModelStub(self.draft_channel)
        self.prompt = [(7 * i + 11) % 4000 + 100 for i in range(PROMPT_LEN)]
        self.hidden: Any = None  # a round's hidden rows (from a Verify), as the router relays
        self.draft_len = 0  # the draft replica holds tokens 0..draft_len

    async def setup(self) -> None:
        first = target_pb2.ForwardItem(
            request_id="bench", token_ids=self.prompt, start_pos=0,
            new_slots=list(range(2 * PROMPT_LEN)), sample=True,
            sampling=target_pb2.SamplingConfig(temperature=0.0),
        )  # fmt: skip
        reply = await self.target.Forward(target_pb2.ForwardRequest(items=[first]), timeout=60)
        self.next_token = reply.next_token_ids[0]
        verify = await self.target.Verify(self.verify_request(), timeout=60)
        self.hidden = verify.results[0].hidden
        await self.ingest()

    def forward_request(self) -> target_pb2.ForwardRequest:
        item = target_pb2.ForwardItem(
            request_id="bench", token_ids=[self.next_token], start_pos=PROMPT_LEN, sample=True
        )
        return target_pb2.ForwardRequest(items=[item])

    def verify_request(self) -> target_pb2.VerifyRequest:
        tokens = [self.next_token, *((31 * i + 5) % 4000 + 100 for i in range(1, 16))]
        item = target_pb2.VerifyItem(
            request_id="bench", start_pos=PROMPT_LEN, token_ids=tokens,
            parent_indices=TREE_PARENTS, return_hidden=True,
        )  # fmt: skip
        return target_pb2.VerifyRequest(items=[item])

    def round_hidden(self) -> Any:
        """ROUND_TOKENS hidden rows in the wire format, cut from a Verify's reply."""
        from model_runtime.wire import tensor_from_pb, tensor_to_pb

        rows = tensor_from_pb(self.hidden)
        while rows.shape[0] < ROUND_TOKENS:
            rows = rows.repeat(2, 1)
        return tensor_to_pb(rows[:ROUND_TOKENS])

    def ingest_chunk(self) -> draft_pb2.IngestChunk:
        from model_runtime.wire import tensor_from_pb, tensor_to_pb

        rows = tensor_from_pb(self.hidden)
        rows = rows[:1].repeat(PROMPT_LEN, 1)
        update = draft_pb2.ContextUpdate(
            request_id="bench", start_pos=0, token_ids=[*self.prompt, self.next_token],
            hidden_start_pos=0, hidden=tensor_to_pb(rows),
        )  # fmt: skip
        return draft_pb2.IngestChunk(update=update)

    async def ingest(self) -> draft_pb2.IngestResponse:
        reply = await self.draft.Ingest(iter([self.ingest_chunk()]), timeout=60)
        self.draft_len, self.round = PROMPT_LEN, 0
        return reply

    def propose_request(self, hidden: Any) -> draft_pb2.ProposeRequest:
        start = self.draft_len
        update = draft_pb2.ContextUpdate(
            request_id="bench", start_pos=start + 1,
            token_ids=[(13 * (start + i)) % 4000 + 100 for i in range(ROUND_TOKENS)],
            hidden_start_pos=start, hidden=hidden,
        )  # fmt: skip
        self.draft_len += ROUND_TOKENS
        self.round += 1
        item = draft_pb2.ProposeItem(update=update, round=self.round)
        return draft_pb2.ProposeRequest(items=[item])

    async def close(self) -> None:
        await self.target_channel.close()
        await self.draft_channel.close()


async def timed(make_request: Callable[[], Any], method: Any, work_field: str) -> tuple:
    request = make_request()
    began = time.perf_counter()
    reply = await method(request, timeout=30)
    client_ms = (time.perf_counter() - began) * 1e3
    return client_ms, getattr(reply, work_field), request.ByteSize(), reply.ByteSize()


def methods(bench: Bench, transport: str) -> dict[str, Any]:
    """The stubs' unary methods, or the same calls over streams as the router makes them."""
    if transport == "unary":
        return {"forward": bench.target.Forward, "verify": bench.target.Verify,
                "propose": bench.draft.Propose}  # fmt: skip
    from plumbing.rpc_stream import StreamedUnary

    return {"forward": StreamedUnary(bench.target.ForwardStream),
            "verify": StreamedUnary(bench.target.VerifyStream),
            "propose": StreamedUnary(bench.draft.ProposeStream)}  # fmt: skip


async def measure_kinds(
    bench: Bench, transport: str, num_calls: int, warmup: int
) -> dict[str, dict]:
    hidden = bench.round_hidden()
    calls = methods(bench, transport)

    async def forward() -> tuple:
        return await timed(bench.forward_request, calls["forward"], "forward_ms")

    async def verify() -> tuple:
        return await timed(bench.verify_request, calls["verify"], "forward_ms")

    async def propose() -> tuple:
        if bench.draft_len + ROUND_TOKENS > MAX_DRAFT_CONTEXT:
            await bench.ingest()  # not timed: keeps the draft context bounded
        return await timed(lambda: bench.propose_request(hidden), calls["propose"], "compute_ms")

    async def ingest() -> tuple:  # a client stream: the same either way
        chunk = bench.ingest_chunk()
        began = time.perf_counter()
        reply = await bench.draft.Ingest(iter([chunk]), timeout=30)
        client_ms = (time.perf_counter() - began) * 1e3
        bench.draft_len, bench.round = PROMPT_LEN, 0
        work_ms = getattr(reply, "compute_ms", float("nan"))  # absent before the field was
        return client_ms, work_ms, chunk.ByteSize(), reply.ByteSize()

    kinds: dict[str, Callable[[], Awaitable[tuple]]] = {
        "forward_decode": forward, "verify_16": verify, "propose": propose,
    }  # fmt: skip
    if transport == "unary":
        kinds["ingest_64"] = ingest
    results = {}
    for name, call in kinds.items():
        for _ in range(warmup):
            await call()
        rows = [await call() for _ in range(num_calls)]
        results[name] = summarize(rows)
        print(transport, name, json.dumps(results[name]), flush=True)
    return results


def summarize(rows: list[tuple]) -> dict[str, Any]:
    client = [r[0] for r in rows]
    work = [r[1] for r in rows]
    has_work = not any(w != w for w in work)  # NaN: the service reports no work time
    out: dict[str, Any] = {
        "num_calls": len(rows),
        "client_ms_median": round(statistics.median(client), 4),
        "client_ms_p90": round(statistics.quantiles(client, n=10)[-1], 4),
        "request_bytes": rows[0][2],
        "reply_bytes": statistics.median(r[3] for r in rows),
    }
    if has_work:
        out["work_ms_median"] = round(statistics.median(work), 4)
        overhead = [c - w for c, w in zip(client, work, strict=True)]
        out["overhead_ms_median"] = round(statistics.median(overhead), 4)
    return out


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
