"""The span of a finished request, built when it ends (router/tracing.py exports it).

``splitspec.generate`` (kind SERVER) runs from the request's arrival to its end, with children
``queue`` (arrival to first scheduled), ``prefill`` (to the first token) and ``decode`` (to the
end). A client's W3C ``traceparent`` makes it a child of the client's span (its ``tracestate``
rides along). The target's and the
drafters' calls get no spans and no trace context: spans per step would add work to every step
of the hot path, for every request in the batch.
Attributes follow the OpenTelemetry GenAI conventions where one fits, else ``splitspec.*``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from protos import generation_pb2 as pb
from router.request_log import request_fields
from router.telemetry import Observer

log = logging.getLogger("splitspec.router")
W3C = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class WallClock:
    """perf_counter seconds (the router's request times) as epoch ns (a span's times), by one
    offset taken at start: a wall-clock step (NTP) later does not bend span durations."""

    offset_ns: int

    @classmethod
    def now(cls) -> WallClock:
        return cls(time.time_ns() - time.perf_counter_ns())

    def ns(self, perf_s: float) -> int:
        return self.offset_ns + round(perf_s * 1e9)


class RequestSpans(Observer):
    def __init__(self, tracer: trace.Tracer, model_name: str, clock: WallClock | None = None):
        self.tracer = tracer
        self.model_name = model_name
        self.clock = clock or WallClock.now()

    def request_finished(self, req: Any, reason: int, now: float) -> None:
        self._safely(req, reason, now, "aborted (Abort, cancellation or an error)")

    def request_failed(self, req: Any, message: str, now: float) -> None:
        self._safely(req, pb.FINISH_REASON_ABORT, now, message)

    def _safely(self, req: Any, reason: int, now: float, error: str) -> None:
        # Called inside a scheduler step: a bug here must cost one span, not the step's requests.
        try:
            self._record(req, reason, now, error)
        except Exception:
            log.exception("tracing: no span for request %s", req.request_id)

    def _record(self, req: Any, reason: int, now: float, error: str) -> None:
        ns = self.clock.ns
        # An empty Context, not the current one: without a traceparent the trace starts here.
        # A tracestate rides along: the span carries the client's vendor entries on.
        context = req.trace_context
        parent = W3C.extract(context) if "traceparent" in context else Context()
        span = self.tracer.start_span(
            "splitspec.generate", parent, trace.SpanKind.SERVER,
            attributes=span_attributes(req, reason, now, self.model_name),
            start_time=ns(req.arrival),
        )  # fmt: skip
        inside = trace.set_span_in_context(span)
        for name, start, end in phases(req, now):
            self.tracer.start_span(name, inside, start_time=ns(start)).end(ns(end))
        if reason == pb.FINISH_REASON_ABORT:
            span.set_status(trace.StatusCode.ERROR, error)
        span.end(ns(now))


def phases(req: Any, now: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of each stage the request reached: waiting, prefill to its first
    token, decoding (a request aborted earlier has fewer)."""
    if req.first_scheduled is None:
        return [("queue", req.arrival, now)]
    stages = [("queue", req.arrival, req.first_scheduled)]
    stages.append(("prefill", req.first_scheduled, req.first_token or now))
    if req.first_token is not None:
        stages.append(("decode", req.first_token, now))
    return stages


def span_attributes(req: Any, reason: int, now: float, model_name: str) -> dict[str, Any]:
    fields = request_fields(req, reason, now)  # the request log's numbers, named alike
    attributes = {
        "splitspec.request_id": req.request_id,
        "gen_ai.request.model": model_name,
        "gen_ai.request.max_tokens": req.options.max_new_tokens,
        "gen_ai.request.temperature": req.options.temperature,
        "gen_ai.request.top_p": req.options.top_p,
        "gen_ai.usage.input_tokens": fields["prompt_tokens"],
        "gen_ai.usage.cache_read.input_tokens": fields["cached_tokens"],
        "gen_ai.usage.output_tokens": fields["completion_tokens"],
        "gen_ai.response.finish_reasons": (fields["finish_reason"],),
        "splitspec.verify_steps": req.verify_steps,
        "splitspec.draft_tokens": req.draft_tokens,
        "splitspec.accepted_tokens": req.accepted_tokens,
        "splitspec.retractions": req.num_retractions,
    }
    if req.first_token is not None:
        attributes["splitspec.ttft_ms"] = fields["ttft_ms"]
    if "acceptance_length" in fields:
        attributes["splitspec.acceptance_length"] = fields["acceptance_length"]
    return attributes
