"""Bursts, abort storms and hostile requests against a running router (used by
tests/test_e2e_hostile.py and benchmarks/reliability.py)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence

import grpc

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from tests.helpers import hostile

GENERATE = "/splitspec.v1.Generation/Generate"
Metadata = list[tuple[str, str]]


def burst(address: str, reqs: Sequence[pb.GenerateRequest], key: Metadata) -> list:
    """Every request sent in one tight loop, none waiting for another: (status name, tokens,
    seconds, message) per request. Each one's seconds run from its own send to its status, as
    its client sees them: a sync call hands its request to gRPC's core at once, and the done
    callback (on gRPC's thread) stamps the end, so the time this loop takes to send the rest
    is not counted against the first (an asyncio client would send them all one by one after
    starting every clock)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = generation_pb2_grpc.GenerationStub(channel)
        sent, ended = [0.0] * len(reqs), [0.0] * len(reqs)
        calls = []
        for i, req in enumerate(reqs):
            sent[i] = time.perf_counter()
            call = stub.Generate(req, timeout=120, metadata=key)
            call.add_done_callback(_stamp(ended, i))
            calls.append(call)
        results = [_drain(call) for call in calls]
        deadline = time.monotonic() + 10  # a callback may run just after its stream ends
        while not all(ended) and time.monotonic() < deadline:
            time.sleep(0.001)
    assert all(ended), "a call ended without its done callback"
    return [(code, tokens, ended[i] - sent[i], msg)
            for i, (code, tokens, msg) in enumerate(results)]


def _stamp(ended: list[float], i: int) -> Callable[[object], None]:
    def done(_call: object) -> None:
        ended[i] = time.perf_counter()

    return done


def _drain(call) -> tuple[str, list[int], str]:
    tokens: list[int] = []
    try:
        for item in call:
            tokens += item.token_ids
        return "OK", tokens, ""
    except grpc.RpcError as err:
        return err.code().name, tokens, err.details() or ""


async def _storm_one(stub, rng: random.Random, req: pb.GenerateRequest, key: Metadata) -> str:
    action = rng.choice(["cancel", "abort", "deadline", "abort-first"])
    delay = rng.uniform(0.0, 0.08)
    timeout = rng.uniform(0.005, 0.15) if action == "deadline" else 120
    if action == "abort-first":
        await stub.Abort(pb.AbortRequest(request_id=req.request_id), timeout=10, metadata=key)
    call = stub.Generate(req, timeout=timeout, metadata=key)

    async def read() -> str:
        last = None
        async for item in call:
            last = item
        return pb.FinishReason.Name(last.finish_reason) if last else "EMPTY"

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(delay)
    if action == "cancel":
        call.cancel()
    elif action == "abort":
        await stub.Abort(pb.AbortRequest(request_id=req.request_id), timeout=10, metadata=key)
    try:
        return await reader
    except asyncio.CancelledError:
        return "CANCELLED"
    except grpc.aio.AioRpcError as err:
        return err.code().name


async def _storm(address: str, reqs: Sequence[pb.GenerateRequest], key: Metadata,
                 concurrency: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(address) as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)

        async def gated(req: pb.GenerateRequest) -> str:
            async with gate:
                return await _storm_one(stub, rng, req, key)

        return Counter(await asyncio.gather(*(gated(r) for r in reqs)))


def storm(address: str, reqs: Sequence[pb.GenerateRequest], key: Metadata, concurrency: int,
          seed: int = 7) -> Counter[str]:
    """Every request cancelled, aborted (before or during) or given a tiny deadline, at random;
    returns how they ended."""
    return asyncio.run(_storm(address, reqs, key, concurrency, seed))


STORM_ENDINGS = {"CANCELLED", "DEADLINE_EXCEEDED", "FINISH_REASON_ABORT", "FINISH_REASON_LENGTH",
                 "RESOURCE_EXHAUSTED"}


def send_hostile(channel: grpc.Channel, case: hostile.Case, key: Metadata,
                 holder: Callable[[], tuple[str, pb.GenerateRequest]]) -> grpc.RpcError | None:
    """Sends one hostile case as raw bytes; returns the error it got (None: it was accepted).
    A duplicate-id case first starts a long request from ``holder()`` (its id and request)."""
    call = channel.unary_stream(GENERATE, request_serializer=None,
                                response_deserializer=pb.GenerateResponse.FromString)
    metadata = [("authorization", "Bearer not-the-key")] if case.wrong_key else key
    raw, held = case.raw, None
    if case.duplicate:
        holder_id, holder_request = holder()
        held = call(holder_request.SerializeToString(), timeout=60, metadata=key)
        next(held)  # in flight now
        raw += hostile.field_bytes(4, holder_id.encode())
    try:
        list(call(raw, timeout=30, metadata=metadata))
        return None
    except grpc.RpcError as err:
        return err
    finally:
        if held is not None:
            held.cancel()
