"""The draft service: `DraftEngine` (rounds, retries, ingest; testable without gRPC) and the thin
`DraftServicer` that decodes messages, calls one engine method and encodes the answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc
import torch

from draft_service.drafter import ContextChunk, ContextMismatch, Drafter
from draft_service.errors import DraftOverloaded, InvalidDraftInput
from draft_service.late_updates import AppliedUpdates, num_rows
from draft_service.tree_types import DraftTree
from draft_service.wire import chunk_from_pb, tree_to_pb
from plumbing.compute_thread import ComputeThread, may_run_inline
from plumbing.rpc_stream import StreamGate
from protos import draft_pb2, draft_pb2_grpc


@dataclass(frozen=True)
class RoundItem:
    """One request's part of a Propose call: what was committed since its last round."""

    chunk: ContextChunk
    round: int

    def fingerprint(self) -> tuple:
        chunk = self.chunk
        return (chunk.start_pos, tuple(chunk.token_ids), chunk.hidden_start_pos, num_rows(chunk))


@dataclass(frozen=True)
class _Proposed:
    round: int
    fingerprint: tuple
    tree: DraftTree


@dataclass(frozen=True)
class IngestResult:
    num_tokens: int
    num_hidden_rows: int


class DraftEngine:
    """Serializes every drafter call and makes Propose retries idempotent.

    Per request it keeps the last proposed round: an item with the same (request_id, round) and
    the same update gets that tree again without appending twice; the same round with another
    update is invalid. Needs-context answers are not kept (the router re-ingests, then retries).
    Ingest and Release forget the kept round, since the state it was proposed from is gone.

    `overload_errors` are the drafter's "no room now" exceptions (e.g. a full draft KV pool);
    they become DraftOverloaded. A drafter with `append_many(chunks) -> mismatched ids` (one
    batched forward, changing nothing on error) gets a Propose's updates in one call.
    """

    def __init__(self, drafter: Drafter, overload_errors: tuple[type[Exception], ...] = ()) -> None:
        self.drafter = drafter
        self.overload_errors = overload_errors
        self._lock = threading.Lock()
        self._last: dict[str, _Proposed] = {}
        self._applied = AppliedUpdates()  # a late Propose's update is not appended twice

    def propose(self, items: Sequence[RoundItem]) -> list[DraftTree | None]:
        """One tree per item, in order; None where the item needs its context ingested again."""
        _require_distinct([item.chunk.request_id for item in items])
        with self._lock:
            trees = [self._retried(item) for item in items]  # checks every item before appending
            new = [item for item, tree in zip(items, trees, strict=True) if tree is None]
            mismatched = self._append(new)
            for item in new:
                if item.chunk.request_id not in mismatched:
                    self._applied.applied(item.chunk)
            fresh = [
                i
                for i, tree in enumerate(trees)
                if tree is None and items[i].chunk.request_id not in mismatched
            ]
            proposed = self._propose([items[i].chunk.request_id for i in fresh])
            for i, tree in zip(fresh, proposed, strict=True):
                trees[i] = tree
                if tree is not None:
                    self._last[items[i].chunk.request_id] = _Proposed(
                        items[i].round, items[i].fingerprint(), tree
                    )
        return trees

    def _retried(self, item: RoundItem) -> DraftTree | None:
        last = self._last.get(item.chunk.request_id)
        if last is None or last.round != item.round:
            return None
        if last.fingerprint != item.fingerprint():
            raise InvalidDraftInput(
                f"round {item.round} of request {item.chunk.request_id!r} "
                "was already proposed from a different update"
            )
        return last.tree

    def _append(self, items: Sequence[RoundItem]) -> set[str]:
        """Appends every update (less what a late call applied already: late_updates.py);
        returns the ids whose update did not line up."""
        chunks = [
            self._applied.unapplied_part(item.chunk, self.drafter.num_tokens(item.chunk.request_id))
            for item in items
        ]
        try:
            append_many = getattr(self.drafter, "append_many", None)
            if append_many is not None:
                return set(append_many(chunks))
            mismatched = set()
            for chunk in chunks:
                try:
                    self.drafter.append(chunk)
                except ContextMismatch:
                    mismatched.add(chunk.request_id)
            return mismatched
        except ValueError as err:
            raise InvalidDraftInput(str(err)) from err
        except self.overload_errors as err:
            raise DraftOverloaded(str(err)) from err

    def _propose(self, request_ids: list[str]) -> list[DraftTree | None]:
        if not request_ids:
            return []
        try:
            return list(self.drafter.propose(request_ids))
        except ContextMismatch:
            # A request that lined up still cannot root a tree (no tokens yet, or hidden rows
            # behind its tokens): find which, one by one; it needs its context again.
            return [self._propose_one(request_id) for request_id in request_ids]

    def _propose_one(self, request_id: str) -> DraftTree | None:
        try:
            return self.drafter.propose([request_id])[0]
        except ContextMismatch:
            return None

    def ingest(self, chunks: Sequence[ContextChunk]) -> IngestResult:
        """Replaces a request's state with the context in `chunks` (checked before any change)."""
        _check_ingest(chunks)
        request_id = chunks[0].request_id
        with self._lock:
            self._forget(request_id)
            for i, chunk in enumerate(chunks):
                try:
                    self.drafter.append(chunk)
                except (ContextMismatch, ValueError) as err:
                    self._forget(request_id)  # no half-ingested context stays behind
                    raise InvalidDraftInput(f"Ingest chunk {i}: {err}") from err
                except self.overload_errors as err:
                    self._forget(request_id)
                    raise DraftOverloaded(str(err)) from err
            num_tokens = self.drafter.num_tokens(request_id)
        return IngestResult(num_tokens, sum(num_rows(c) for c in chunks))

    def release(self, request_ids: Iterable[str]) -> int:
        with self._lock:
            return sum(self._forget(request_id) for request_id in set(request_ids))

    def release_all(self) -> int:
        with self._lock:
            return sum(self._forget(request_id) for request_id in self.drafter.held_ids())

    def _forget(self, request_id: str) -> bool:
        self._last.pop(request_id, None)
        self._applied.forget(request_id)
        return self.drafter.release(request_id)


def _require_distinct(request_ids: list[str]) -> None:
    if len(set(request_ids)) != len(request_ids):
        raise InvalidDraftInput("a Propose call names a request more than once")


def _check_ingest(chunks: Sequence[ContextChunk]) -> None:
    """Chunks of one request, tokens and hidden rows each contiguous from position 0."""
    if not chunks:
        raise InvalidDraftInput("Ingest needs at least one chunk")
    request_id = chunks[0].request_id
    num_tokens = num_hidden = 0
    for i, chunk in enumerate(chunks):
        if chunk.request_id != request_id:
            raise InvalidDraftInput(
                f"Ingest chunk {i} is for {chunk.request_id!r}, "
                f"not {request_id!r}: one request per stream"
            )
        if chunk.start_pos != num_tokens:
            raise InvalidDraftInput(
                f"Ingest chunk {i} starts at token {chunk.start_pos}, expected {num_tokens}"
            )
        if num_rows(chunk) and chunk.hidden_start_pos != num_hidden:
            raise InvalidDraftInput(
                f"Ingest chunk {i} starts hidden rows at "
                f"{chunk.hidden_start_pos}, expected {num_hidden}"
            )
        num_tokens += len(chunk.token_ids)
        num_hidden += num_rows(chunk)


class DraftServicer(draft_pb2_grpc.DraftModelServicer):
    """Decoding, engine calls and encoding take the compute thread's turn, on that thread unless
    they may run on the handler's own (plumbing/compute_thread.py); an Ingest stream is read
    before its turn."""

    def __init__(
        self,
        engine: DraftEngine,
        info: draft_pb2.DraftInfo,
        compute: ComputeThread,
        streams: StreamGate,
    ) -> None:
        self.engine = engine
        self.info = info
        inline = may_run_inline(info.device, torch.get_num_threads())
        compute.thread_setup = torch.get_num_threads  # torch's thread count on each thread
        self.run = compute.run_here if inline else compute.run
        self.streams = streams  # ProposeStream: a router holds one

    def Propose(self, request, context):  # noqa: N802 (gRPC naming)
        return _guard(context, lambda: self.run(self._propose, request))

    def _propose(self, request: draft_pb2.ProposeRequest) -> draft_pb2.ProposeResponse:
        started = time.perf_counter()
        items = [RoundItem(chunk_from_pb(it.update), it.round) for it in request.items]
        trees = self.engine.propose(items)
        pairs = zip(items, trees, strict=True)
        return draft_pb2.ProposeResponse(
            trees=[tree_to_pb(item.chunk.request_id, tree) for item, tree in pairs],
            compute_ms=(time.perf_counter() - started) * 1e3,
            device_ms=self.engine.drafter.take_device_ms(),
        )

    def ProposeStream(self, request_iterator, context):  # noqa: N802
        return self.streams.serve(request_iterator, context, self.Propose)

    def Ingest(self, request_iterator, context):  # noqa: N802
        # The whole stream is read before the turn is taken: a slow sender must not stall other
        # requests' rounds.
        messages = list(request_iterator)
        return _guard(context, lambda: self.run(self._ingest, messages))

    def _ingest(self, messages: list[draft_pb2.IngestChunk]) -> draft_pb2.IngestResponse:
        started = time.perf_counter()
        result = self.engine.ingest([chunk_from_pb(m.update) for m in messages])
        self.engine.drafter.take_device_ms()  # a Propose reports its own device time only
        return draft_pb2.IngestResponse(
            num_tokens=result.num_tokens,
            num_hidden_rows=result.num_hidden_rows,
            compute_ms=(time.perf_counter() - started) * 1e3,
        )

    def Release(self, request, context):  # noqa: N802
        if request.all:
            return draft_pb2.ReleaseResponse(num_released=self.run(self.engine.release_all))
        released = self.run(self.engine.release, list(request.request_ids))
        return draft_pb2.ReleaseResponse(num_released=released)

    def GetInfo(self, request, context):  # noqa: N802
        # Not through the compute thread: admission asks with a 2 s deadline, which a long
        # Ingest could outlast; a count read beside a call is as good as one read after it.
        info = draft_pb2.DraftInfo()
        info.CopyFrom(self.info)
        info.num_requests = len(self.engine.drafter.held_ids())
        return info


def _guard(context: grpc.ServicerContext, fn):
    try:
        return fn()
    except InvalidDraftInput as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except DraftOverloaded as err:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
