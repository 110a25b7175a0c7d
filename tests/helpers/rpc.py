"""Talking to a running router over real gRPC, with a deadline on every call."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import draft_pb2, draft_pb2_grpc, generation_pb2_grpc, target_pb2, target_pb2_grpc
from protos import generation_pb2 as pb

GENERATE_TIMEOUT_S = 180.0  # a whole stream, queueing included
UNARY_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0


@dataclass
class Stream:
    """Every item of one Generate stream, and what they add up to."""

    items: list[pb.GenerateResponse] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [t for item in self.items for t in item.token_ids]

    @property
    def text(self) -> str:
        return "".join(item.text for item in self.items)

    @property
    def final(self) -> pb.GenerateResponse:
        assert self.items, "the stream had no items"
        return self.items[-1]

    @property
    def blocks(self) -> list[list[int]]:
        """Token ids per item: one committed block each (items without tokens skipped)."""
        return [list(item.token_ids) for item in self.items if item.token_ids]


class Router:
    """A sync client of the public API: one channel, every call with a deadline."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def generate(
        self, request: pb.GenerateRequest, timeout_s: float = GENERATE_TIMEOUT_S
    ) -> Stream:
        stream = Stream()
        for item in self.stub.Generate(request, timeout=timeout_s):
            stream.items.append(item)
        return stream

    def generate_many(
        self, requests: Sequence[pb.GenerateRequest], timeout_s: float = GENERATE_TIMEOUT_S
    ) -> list[Stream]:
        """Sends every request at once (one thread each) and returns their streams in order."""
        return self.generate_many_observed(requests, timeout_s)[0]

    def generate_many_observed(
        self, requests: Sequence[pb.GenerateRequest], timeout_s: float = GENERATE_TIMEOUT_S
    ) -> tuple[list[Stream], int]:
        """As generate_many; also polls GetServerStatus meanwhile and returns the largest
        num_running it saw (evidence that the requests were batched together)."""
        max_running = 0
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            futures = [pool.submit(self.generate, r, timeout_s) for r in requests]
            while not all(f.done() for f in futures):
                max_running = max(max_running, self.status().num_running)
                time.sleep(0.05)
            return [f.result() for f in futures], max_running

    def generate_each(self, requests: Sequence[pb.GenerateRequest]) -> list[Stream]:
        """One request at a time: each runs alone."""
        return [self.generate(r) for r in requests]

    def status(self) -> pb.ServerStatus:
        return self.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=UNARY_TIMEOUT_S)

    def model_info(self) -> pb.ModelInfo:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=UNARY_TIMEOUT_S)

    def abort(self, request_id: str) -> bool:
        reply = self.stub.Abort(pb.AbortRequest(request_id=request_id), timeout=UNARY_TIMEOUT_S)
        return reply.found

    def wait_idle(self, timeout_s: float = IDLE_TIMEOUT_S) -> pb.ServerStatus:
        """Polls GetServerStatus until nothing runs or waits; returns that status."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.num_running == 0 and status.num_waiting == 0:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"router not idle after {timeout_s} s: {status}")
            time.sleep(0.05)


def greedy(ids: Sequence[int], max_new_tokens: int, request_id: str = "") -> pb.GenerateRequest:
    """A greedy request sent as token ids."""
    request = pb.GenerateRequest(request_id=request_id)
    request.input_ids.ids.extend(ids)
    request.sampling.max_new_tokens = max_new_tokens
    request.sampling.temperature = 0.0
    return request


def assert_slots_accounted(status: pb.ServerStatus) -> None:
    """Idle: every KV slot is free or held by the radix cache, none leaked to a request."""
    assert status.num_running == 0 and status.num_waiting == 0, status
    assert status.num_free_slots + status.num_cached_tokens == status.num_total_slots, (
        f"{status.num_free_slots} free + {status.num_cached_tokens} cached != "
        f"{status.num_total_slots} total: slots leaked"
    )


class BackgroundStream:
    """A Generate stream read on a thread of its own; its items as they arrive."""

    def __init__(self, router: Router, request: pb.GenerateRequest) -> None:
        self.items: list[pb.GenerateResponse] = []
        self.errors: list[Exception] = []
        self.reader = threading.Thread(target=self._read, args=(router, request))
        self.reader.start()

    def _read(self, router: Router, request: pb.GenerateRequest) -> None:
        try:
            self.items.extend(router.stub.Generate(request, timeout=120))
        except Exception as err:  # reported by the test
            self.errors.append(err)

    @property
    def token_ids(self) -> list[int]:
        return [t for item in self.items for t in item.token_ids]

    def wait_for_tokens(self, count: int) -> None:
        while len(self.token_ids) < count and self.reader.is_alive():
            time.sleep(0.005)

    def finish(self) -> list[int]:
        self.reader.join(120)
        assert not self.errors, self.errors
        assert self.items[-1].finish_reason == pb.FINISH_REASON_LENGTH
        return self.token_ids


def held_requests(target: str, draft: str, settle_s: float = 0.0) -> dict[str, int]:
    """Requests whose state the target and the draft replica at these addresses hold, asked by
    GetInfo (a Release to count would drop what it finds); with ``settle_s``, asked again until
    both hold none or that long has passed."""
    with (
        grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as on_target,
        grpc.insecure_channel(draft, options=CHANNEL_OPTIONS) as on_draft,
    ):
        probes = {
            "target": lambda: target_pb2_grpc.TargetModelStub(on_target).GetInfo(
                target_pb2.GetInfoRequest(), timeout=UNARY_TIMEOUT_S),
            "draft": lambda: draft_pb2_grpc.DraftModelStub(on_draft).GetInfo(
                draft_pb2.GetInfoRequest(), timeout=UNARY_TIMEOUT_S),
        }  # fmt: skip
        deadline = time.monotonic() + settle_s
        while True:
            held = {name: probe().num_requests for name, probe in probes.items()}
            if not any(held.values()) or time.monotonic() >= deadline:
                return held
            time.sleep(0.05)
