"""The calls benchmarks/rpc_overhead.py times: one request on the target and on an EAGLE draft
replica, driven the way the router drives them (grpc.aio stubs, its channel options, unary or
over streams), and each kind's medians of client time, service work and their difference."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

PROMPT_LEN = 64
TREE_PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2, 3, 5, 5, 6, 7, 9, 10, 11]  # 16 nodes, EAGLE-like
ROUND_TOKENS = 3  # tokens (and hidden rows) a round commits: the CPU tree's ~3 per step
MAX_DRAFT_CONTEXT = 1500  # re-ingest before the draft context grows past it


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
