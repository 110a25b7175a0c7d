"""The public Generation service: validate, submit to the scheduler, stream its items."""

from __future__ import annotations

import uuid

import grpc

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from router.admission import AdmissionLimits, check_fields, check_prompt_len
from router.discovery import DraftDiscovery
from router.errors import DuplicateRequest, InvalidRequest, Overloaded, ServiceFailure
from router.format_cache import FormatCache
from router.output import coalesce, within_receive_limit
from router.request import TRACE_HEADERS, Request
from router.scheduler import Scheduler
from router.status_details import bad_request
from router.strict_parse import Unparsable
from router.validation import Limits, prompt_ids, sampling_options

_STATUS = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DuplicateRequest: grpc.StatusCode.ALREADY_EXISTS,
    ServiceFailure: grpc.StatusCode.UNAVAILABLE,
}


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(
        self,
        scheduler: Scheduler,
        limits: Limits,
        model_info: pb.ModelInfo,
        admit: AdmissionLimits | None = None,
        discoveries: list[DraftDiscovery] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.limits = limits
        self.model_info = model_info
        self.admit = admit or AdmissionLimits()
        self.discoveries = discoveries or []
        self.formats = FormatCache(scheduler.tokenizer)  # structured output's, compiled once

    async def Generate(self, request, context):  # noqa: N802 (gRPC naming)
        self.scheduler.intake.arrived()
        if isinstance(request, Unparsable):  # router/strict_parse.py
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            await self.prepare(request)
            req = self._build(request, _trace_context(context))
            self.scheduler.submit(req)
        except (InvalidRequest, Overloaded, DuplicateRequest, ServiceFailure) as err:
            _refuse(context, err)
            return
        try:
            while True:
                item = coalesce(await req.outbox.get(), req.outbox)
                if isinstance(item, Exception):
                    await context.abort(
                        _STATUS.get(type(item), grpc.StatusCode.INTERNAL), str(item)
                    )
                for part in within_receive_limit(item):
                    yield part
                if item.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    return
        finally:
            # However the stream ends early (cancellation arrives as CancelledError, or as
            # GeneratorExit while suspended at yield), the request stops and gives its slots
            # back. A finished request's id may already belong to a newer request: leave it.
            if not req.finished:
                self.scheduler.abort(req.request_id)

    async def Abort(self, request, context):  # noqa: N802
        return pb.AbortResponse(found=self.scheduler.abort(request.request_id))

    async def GetModelInfo(self, request, context):  # noqa: N802
        return self.model_info

    async def GetServerStatus(self, request, context):  # noqa: N802
        s, kv = self.scheduler, self.scheduler.kv
        in_flight = [*s.running, *s.waiting]
        return pb.ServerStatus(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            num_total_slots=kv.num_total,
            num_free_slots=kv.num_free,
            num_cached_tokens=kv.cache.num_cached_tokens,
            num_finished_requests=s.counters.num_finished,
            num_generated_tokens=s.counters.generated_tokens(in_flight),
            uptime_s=s.counters.uptime_s,
            speculation=s.counters.speculation(in_flight),
            speculation_switch=s.mode.switch.status(),
            target_only_steps=s.mode.timings.status(speculative=False),
            speculative_steps=s.mode.timings.status(speculative=True),
            draft_replicas=[
                pb.DraftReplicaStatus(
                    address=r.address,
                    method=r.info.method if r.info else "",
                    healthy=r.healthy,
                    num_requests=len(r.request_ids),
                    source=r.source,
                    error=r.error,
                )
                for r in s.spec.pool.replicas
            ],
            draft_discovery=[d.status() for d in self.discoveries],
            num_retractions=s.counters.num_retractions,
            decode_steps=s.multi_step.max_steps,
            multi_step_forwards=s.multi_step.num_forwards,
            grammar_bursts=s.multi_step.bursts.num_bursts,
            grammar_bursts_cut=s.multi_step.bursts.num_cut,
            unavailable_reason=s.target_unavailable or "",
        )

    async def prepare(self, request: pb.GenerateRequest) -> None:
        """What a request needs before it is built, off the event loop: its structured-output
        format compiled (router/format_cache.py). A full queue refuses before any of it."""
        self.scheduler.check_queue()
        await self.formats.warm(request.sampling.structured_output)

    def _build(
        self, request: pb.GenerateRequest, trace_context: dict[str, str] | None = None
    ) -> Request:
        self.scheduler.check_queue()  # a full queue refuses before any tokenizing
        check_fields(request, self.admit)
        ids = prompt_ids(request, self.scheduler.tokenizer, self.limits)
        check_prompt_len(len(ids), self.admit)
        eos_ids = self.scheduler.tokenizer.eos_token_ids
        options = sampling_options(request, len(ids), self.limits, eos_ids)
        constraint = self.formats.constraint(request.sampling, options)
        kv = self.scheduler.kv
        needed = kv.slots_needed(len(ids), options.max_new_tokens)
        if needed > kv.num_total:
            raise InvalidRequest(
                f"request needs {needed} KV slots but the pool holds {kv.num_total}; "
                "shorten the prompt or max_new_tokens"
            )
        spec = request.speculation
        speculate = spec.enabled if spec.HasField("enabled") else None
        forced = spec.forced_drafts if spec.HasField("forced_drafts") else True
        request_id = request.request_id or uuid.uuid4().hex
        return Request(
            request_id, ids, options, speculate, trace_context=trace_context or {},
            constraint=constraint, forced_drafts=forced,
        )  # fmt: skip


def _trace_context(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The caller's W3C trace context from its metadata (request_spans.py continues it)."""
    metadata = context.invocation_metadata() or ()
    return {key: value for key, value in metadata if key in TRACE_HEADERS}


def _refuse(context: grpc.aio.ServicerContext, err: Exception) -> None:
    """Status and return, not abort(): no exception through gRPC's handler, a third less of the
    loop's time a refusal (a burst's excess is refused one after another). A bad field's
    refusal also names it in the rich error model's details (router/status_details.py)."""
    if isinstance(err, InvalidRequest) and err.field:
        status = bad_request(str(err), err.field)
        context.set_trailing_metadata(status.trailing_metadata)
    context.set_code(_STATUS[type(err)])
    context.set_details(str(err))
