"""A steady load of greedy streams against a router, on its own thread and event loop: a fixed
number of workers, each starting the next prompt as soon as its stream ends, every item
stamped with its arrival time. Used by the fault tests and the reliability suite."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc


@dataclass
class StreamRecord:
    prompt_index: int
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    error: str = ""
    done: bool = False
    ended: float = 0.0  # when the stream ended (last item, or the error)


class SteadyLoad:
    def __init__(
        self,
        address: str,
        requests: Sequence[pb.GenerateRequest],
        concurrency: int,
        timeout_s: float = 120.0,
        metadata: list[tuple[str, str]] | None = None,
    ) -> None:
        self.address, self.requests = address, list(requests)
        self.concurrency, self.timeout_s, self.metadata = concurrency, timeout_s, metadata
        self.records: list[StreamRecord] = []
        self._next = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> SteadyLoad:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> list[StreamRecord]:
        """Lets every running stream finish, starts no more; returns all records."""
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "load did not wind down"
        return self.records

    async def _main(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            await asyncio.gather(*(self._worker(stub) for _ in range(self.concurrency)))

    async def _worker(self, stub) -> None:
        while not self._stop.is_set():
            index = next(self._next)
            if index >= len(self.requests):
                return
            record = StreamRecord(index)
            self.records.append(record)
            try:
                call = stub.Generate(
                    self.requests[index], timeout=self.timeout_s, metadata=self.metadata
                )
                async for item in call:
                    record.times.append(time.monotonic())
                    record.tokens += item.token_ids
            except grpc.aio.AioRpcError as err:
                record.error = f"{err.code().name}: {err.details()}"
            record.done, record.ended = True, time.monotonic()


def step_gaps(records: Sequence[StreamRecord], start: float, end: float) -> list[float]:
    """Gaps between consecutive items of each stream that end inside [start, end]: every
    running request gets one item per step, so these are the steps' durations."""
    gaps = []
    for r in records:
        for before, after in itertools.pairwise(r.times):
            if start <= after <= end:
                gaps.append(after - before)
    return gaps


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
