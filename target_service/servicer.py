"""Thin gRPC servicer: decode the message, call the engine, encode the answer."""

from __future__ import annotations

import grpc
import torch

from model_runtime.wire import tensor_to_pb
from plumbing.compute_thread import ComputeThread, may_run_inline
from plumbing.omp_spin import release_idle_workers
from plumbing.rpc_stream import StreamGate
from protos import target_pb2, target_pb2_grpc
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.errors import InvalidStep, OutOfCapacity, UnknownRequest
from target_service.logprob_pass import TokenLogprobs
from target_service.ownership import Held, Ownership, router_id_of
from target_service.request_table import SamplingSpec
from target_service.step_results import VerifyStep

# 256 rows of SmolLM2 (576 fp32) are 576 KiB: far under the message limit, large enough to
# keep per-message overhead small.
HIDDEN_ROWS_PER_CHUNK = 256

_STATUS = {
    InvalidStep: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownRequest: grpc.StatusCode.NOT_FOUND,
    OutOfCapacity: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def item_from_pb(pb: target_pb2.ForwardItem) -> StepItem:
    sampling = None
    if pb.HasField("sampling"):
        s = pb.sampling
        sampling = SamplingSpec(
            s.temperature, s.top_p, s.top_k, s.seed, s.presence_penalty, s.frequency_penalty,
            s.logprobs, s.top_logprobs, tuple(sorted(s.logit_bias.items())),
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty or 1.0,  # unset (0): off
            repetition_context=tuple(s.repetition_context),
            min_tokens=s.min_tokens,
            min_tokens_banned_ids=tuple(s.min_tokens_banned_ids),
        )  # fmt: skip
    return StepItem(
        pb.request_id, list(pb.token_ids), pb.start_pos, list(pb.new_slots), pb.sample, sampling,
        list(pb.scored_ids), pb.allowed_tokens,
    )  # fmt: skip


def logprobs_to_pb(answer: TokenLogprobs | None) -> target_pb2.Logprobs:
    if answer is None:  # a request that did not ask, in a step where another did
        return target_pb2.Logprobs()
    return target_pb2.Logprobs(
        token_logprobs=answer.token_logprobs,
        top_ids=answer.top_ids,
        top_logprobs=answer.top_logprobs,
    )


class TargetServicer(target_pb2_grpc.TargetModelServicer):
    def __init__(
        self,
        engine: TargetEngine,
        info: target_pb2.TargetInfo,
        compute: ComputeThread,
        streams: StreamGate,
    ) -> None:
        self.engine = engine
        self.info = info
        # The engine owns device state: every call takes the compute thread's turn, and runs
        # on that thread unless it may run on the handler's own (plumbing/compute_thread.py).
        inline = may_run_inline(engine.device.type, torch.get_num_threads())
        compute.thread_setup = torch.get_num_threads  # torch's thread count on each thread
        self.run = compute.run_here if inline else compute.run
        self.streams = streams  # ForwardStream and VerifyStream: a router holds one of each
        self.ownership = Ownership()  # the router whose calls are taken (ownership.py)

    def Forward(self, request, context):  # noqa: N802 (gRPC naming)
        items = [item_from_pb(it) for it in request.items]
        steps = max(1, request.decode_steps)  # 0: a message from before multi-step decoding
        result = self._call(context, self.engine.forward, items, steps)
        return target_pb2.ForwardResponse(
            next_token_ids=result.next_token_ids,
            forward_ms=result.forward_ms,
            device_ms=result.device_ms,
            logprobs=[logprobs_to_pb(x) for x in result.logprobs or []],
            scored=[logprobs_to_pb(x) for x in result.scored or []],
        )

    def Verify(self, request, context):  # noqa: N802
        items = [
            VerifyItem(
                it.request_id,
                it.start_pos,
                list(it.token_ids),
                list(it.parent_indices),
                list(it.new_slots),
                it.return_hidden,
                it.allowed_tokens,
            )
            for it in request.items
        ]
        results, forward_ms, device_ms = self._call(context, self._verify, items)
        return target_pb2.VerifyResponse(
            results=[
                target_pb2.VerifyResult(
                    token_ids=r.token_ids,
                    num_accepted=r.num_accepted,
                    hidden=tensor_to_pb(r.hidden) if r.hidden is not None else None,
                    logprobs=logprobs_to_pb(r.logprobs) if r.logprobs is not None else None,
                )
                for r in results
            ],
            forward_ms=forward_ms,
            device_ms=device_ms,
        )

    def _verify(self, items: list[VerifyItem]) -> VerifyStep:
        """The engine's verify, then (on CPU, on the compute thread that owns them) the end of
        its idle OpenMP workers: the drafter's round comes next, on the same cores
        (plumbing/omp_spin.py)."""
        step = self.engine.verify(items)
        if self.engine.device.type == "cpu":
            release_idle_workers()
        return step

    def ForwardStream(self, request_iterator, context):  # noqa: N802
        return self.streams.serve(request_iterator, context, self.Forward)

    def VerifyStream(self, request_iterator, context):  # noqa: N802
        return self.streams.serve(request_iterator, context, self.Verify)

    def ReadHidden(self, request, context):  # noqa: N802
        rows_per_chunk = request.rows_per_chunk or HIDDEN_ROWS_PER_CHUNK
        rows = self._call(
            context, self.engine.read_hidden, request.request_id, request.start_pos, request.end_pos
        )
        for offset in range(0, rows.shape[0], rows_per_chunk):
            chunk = rows[offset : offset + rows_per_chunk]
            yield target_pb2.HiddenChunk(
                start_pos=request.start_pos + offset, hidden=tensor_to_pb(chunk)
            )

    def Release(self, request, context):  # noqa: N802
        self._admit(context)
        if request.all:
            return target_pb2.ReleaseResponse(num_released=self.run(self.engine.release_all))
        released = self.run(self.engine.release, list(request.request_ids))
        return target_pb2.ReleaseResponse(num_released=released)

    def GetInfo(self, request, context):  # noqa: N802
        # Not through the compute thread: the router's probes would wait behind a long step.
        info = target_pb2.TargetInfo()
        info.CopyFrom(self.info)
        info.num_requests = len(self.engine.table)
        return info

    def Claim(self, request, context):  # noqa: N802
        if request.give_up:
            self.ownership.give_up(request.router_id)
            return target_pb2.ClaimResponse()
        if not request.router_id or not request.lease_s > 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a claim needs a router_id and a lease_s > 0 (got {request.router_id!r}, "
                f"{request.lease_s})",
            )
        try:
            self.ownership.claim(request.router_id, request.router_name, request.lease_s)
        except Held as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return target_pb2.ClaimResponse()

    def _admit(self, context) -> None:
        try:
            self.ownership.admit(router_id_of(context))
        except Held as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))

    def _call(self, context, fn, *args):
        self._admit(context)
        try:
            return self.run(fn, *args)
        except (InvalidStep, UnknownRequest, OutOfCapacity) as err:
            context.abort(_STATUS[type(err)], str(err))
